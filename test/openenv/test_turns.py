"""The steps of a serving process's sessions take turns: one at a time, first come first
served, a stalled step letting the next start beside it (``openenv/_turns``)."""

from __future__ import annotations

import threading

from torchrl_trl_interop.openenv._turns import StepTurns

TIMEOUT_S = 60


def wait_for(condition):
    """Polls ``condition`` (a thread's progress) until true; fails after ``TIMEOUT_S``."""
    done = threading.Event()
    for _ in range(TIMEOUT_S * 100):
        if condition():
            return
        done.wait(0.01)
    raise AssertionError("timed out")


def test_steps_run_one_at_a_time_in_the_order_they_asked():
    turns = StepTurns(stall_s=TIMEOUT_S)  # no step stalls here
    release, log, most = threading.Event(), [], []

    def step(name, hold=None):
        with turns:
            most.append(turns.running())
            log.append(name)
            if hold is not None:
                assert hold.wait(TIMEOUT_S)

    first = threading.Thread(target=step, args=("first", release))
    first.start()
    wait_for(lambda: log == ["first"])
    queued = []
    for n, name in enumerate(("b", "c", "d", "e"), 1):  # each asks once the one before waits
        queued.append(threading.Thread(target=step, args=(name,)))
        queued[-1].start()
        wait_for(lambda n=n: turns.waiting() == n)
    release.set()
    for thread in (first, *queued):
        thread.join(TIMEOUT_S)
    assert log == ["first", "b", "c", "d", "e"]
    assert most == [1] * 5  # never two at once
    assert turns.running() == turns.waiting() == 0


def test_a_stalled_step_lets_the_next_start_beside_it():
    turns = StepTurns(stall_s=0.05)
    release, log = threading.Event(), []

    def stalled():
        with turns:
            log.append("stalled starts")
            assert release.wait(TIMEOUT_S)  # waits, as a tool calling a service would
            log.append("stalled ends")

    def quick():
        with turns:
            log.append(f"quick starts beside {turns.running() - 1}")

    slow = threading.Thread(target=stalled)
    slow.start()
    wait_for(lambda: log == ["stalled starts"])
    fast = threading.Thread(target=quick)
    fast.start()
    fast.join(TIMEOUT_S)
    release.set()
    slow.join(TIMEOUT_S)
    assert log == ["stalled starts", "quick starts beside 1", "stalled ends"]


def test_steps_beside_each_other_end_in_any_order():
    """Every step stalls at once (``stall_s=0``): they all run beside each other, and each one
    ends with its own turn, whichever ends first."""
    turns = StepTurns(stall_s=0)
    go, errors = threading.Barrier(8, timeout=TIMEOUT_S), []

    def step():
        try:
            for _ in range(200):
                with turns:
                    pass
            go.wait()
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=step) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT_S)
    assert errors == [] and turns.running() == turns.waiting() == 0


def test_an_error_gives_the_turn_back():
    turns = StepTurns()
    try:
        with turns:
            raise ValueError("the step failed")
    except ValueError:
        pass
    with turns:
        assert turns.running() == 1
    assert turns.running() == 0
