"""The calls of a serving process's sessions: one thread runs them in the order they came, a
stalled one letting the next start on another thread (``openenv/_step_executor``)."""

from __future__ import annotations

import threading

import pytest

from torchrl_trl_interop.openenv._step_executor import StepExecutor

TIMEOUT_S = 60


def wait_for(condition):
    """Polls ``condition`` (another thread's progress) until true; fails after ``TIMEOUT_S``."""
    done = threading.Event()
    for _ in range(TIMEOUT_S * 100):
        if condition():
            return
        done.wait(0.01)
    raise AssertionError("timed out")


@pytest.fixture
def executor():
    executor = StepExecutor(stall_s=TIMEOUT_S)  # no call stalls, unless a test says otherwise
    yield executor
    executor.shutdown(cancel_futures=True)


def test_calls_run_one_at_a_time_in_the_order_they_came_on_one_thread(executor):
    release, log = threading.Event(), []

    def call(name, hold=None):
        log.append((name, executor.running(), threading.get_ident()))
        if hold is not None:
            assert hold.wait(TIMEOUT_S)

    futures = [executor.submit(call, "first", release)]
    wait_for(lambda: len(log) == 1)
    futures += [executor.submit(call, name) for name in "bcdefgh"]
    assert executor.waiting() == 7
    release.set()
    for future in futures:
        future.result(TIMEOUT_S)
    assert [name for name, _, _ in log] == ["first", *"bcdefgh"]
    assert {running for _, running, _ in log} == {1}  # never two at once
    assert len({thread for _, _, thread in log}) == 1  # the thread that ran one took the next
    assert executor.running() == executor.waiting() == 0


def test_a_stalled_call_lets_the_next_start_beside_it():
    executor = StepExecutor(stall_s=0.05)
    release, log = threading.Event(), []

    def stalled():
        log.append("stalled starts")
        assert release.wait(TIMEOUT_S)  # waits, as a tool calling a service would
        log.append("stalled ends")

    def quick():
        log.append(f"quick starts beside {executor.running() - 1}")

    slow = executor.submit(stalled)
    wait_for(lambda: log == ["stalled starts"])
    executor.submit(quick).result(TIMEOUT_S)
    release.set()
    slow.result(TIMEOUT_S)
    assert log == ["stalled starts", "quick starts beside 1", "stalled ends"]
    executor.shutdown()


def test_calls_from_many_threads_stalling_at_once_all_run_and_threads_go_back():
    """Every call stalls at once (``stall_s=0``): they run beside each other, and once they are
    done the executor keeps at most two idle threads."""
    executor = StepExecutor(stall_s=0)
    counts, lock = [], threading.Lock()

    def call(n):
        with lock:
            counts.append(n)
        return n

    def session(start):
        return [executor.submit(call, start + n).result(TIMEOUT_S) for n in range(200)]

    threads, results = [], {}
    for start in range(0, 1600, 200):
        thread = threading.Thread(target=lambda s=start: results.update({s: session(s)}))
        threads.append(thread)
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT_S)
    assert sorted(counts) == list(range(1600))
    assert all(results[s] == list(range(s, s + 200)) for s in results) and len(results) == 8
    wait_for(lambda: executor.running() == executor.waiting() == 0 and executor.threads() <= 2)
    executor.shutdown()


def test_an_error_goes_to_its_future_and_the_next_call_runs(executor):
    def fails():
        raise ValueError("the step failed")

    with pytest.raises(ValueError, match="the step failed"):
        executor.submit(fails).result(TIMEOUT_S)
    assert executor.submit(pow, 2, 5).result(TIMEOUT_S) == 32


def test_shutdown_runs_or_cancels_what_is_queued_then_refuses():
    executor, release = StepExecutor(stall_s=TIMEOUT_S), threading.Event()
    first = executor.submit(release.wait, TIMEOUT_S)
    wait_for(lambda: executor.running() == 1)
    queued = executor.submit(pow, 3, 2)
    stopper = threading.Thread(target=executor.shutdown)
    stopper.start()
    with pytest.raises(RuntimeError, match="after shutdown"):
        executor.submit(pow, 2, 2)
    release.set()
    stopper.join(TIMEOUT_S)
    assert first.result(0) is True and queued.result(0) == 9
    assert executor.threads() == 0

    executor, release = StepExecutor(stall_s=TIMEOUT_S), threading.Event()
    first = executor.submit(release.wait, TIMEOUT_S)
    wait_for(lambda: executor.running() == 1)
    dropped = executor.submit(pow, 3, 2)
    executor.shutdown(wait=False, cancel_futures=True)
    release.set()
    assert first.result(TIMEOUT_S) is True and dropped.cancelled()
