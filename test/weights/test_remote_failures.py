"""A ``RemotePolicy`` never hangs and never outlives its trainer (issue 20, items 11 and 12).

* A push whose weights do not fit the generator (another size, a ``torch.compile`` prefix)
  raises before anything is sent, naming the parameter and both shapes, or the names.
* A push into a generator that died raises at once, with its exit code.
* A generator whose trainer process was SIGKILLed exits within seconds.

Each test has a timeout: a hang is a failure.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import textwrap
import time
from functools import partial
from types import SimpleNamespace

import pytest
import torch
from _background import background

from torchrl_trl_interop import RemotePolicy, WeightSyncCallback, weights_checksum
from torchrl_trl_interop.testing import toy_causal_lm, toy_generator_policy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

WIDER = {"intermediate_size": 128}


def started():
    """A started generator (the toy policy, version 0) and the trainer model it was started from."""
    policy = RemotePolicy(partial(toy_generator_policy), num_threads=1, timeout=120)
    trainer_model = toy_causal_lm(seed=1)
    policy.update_policy_weights_(trainer_model, policy_version=0)
    return policy, trainer_model


@pytest.fixture(scope="module")
def serving():
    """One generator for the tests that leave it alive."""
    policy, trainer_model = started()
    yield policy, trainer_model
    policy.close()


@pytest.fixture
def remote():
    """A generator of its own, for a test that kills it."""
    policy, trainer_model = started()
    yield policy, trainer_model
    policy.close()


def test_weights_of_another_size_raise_and_the_generator_keeps_serving(serving):
    policy, trainer_model = serving
    version = policy.policy_version
    start = time.monotonic()
    with pytest.raises(ValueError) as info:
        WeightSyncCallback(policy).push(toy_causal_lm(**WIDER), 1)
    assert time.monotonic() - start < 10
    assert (  # the call made names the error; "the generator" names the receiver
        "WeightSyncCallback: the weights do not fit the generator: parameter "
        "'model.layers.0.mlp.gate_proj.weight': trainer [128, 32], generator [64, 32]"
    ) in str(info.value)
    # nothing was sent: the generator still serves the weights it had
    assert policy.weights_checksum() == (version, weights_checksum(trainer_model))
    with torch.no_grad():
        trainer_model.lm_head.weight.add_(1.0)
    WeightSyncCallback(policy).push(trainer_model, version + 2)
    assert policy.weights_checksum() == (version + 2, weights_checksum(trainer_model))


def test_prefixed_names_raise(serving):
    policy, trainer_model = serving
    version = policy.policy_version
    with pytest.raises(KeyError, match=r"prefix '_orig_mod\.'.*model\._orig_mod"):
        policy.update_policy_weights_(torch.compile(trainer_model), policy_version=version + 1)
    assert policy.weights_checksum() == (version, weights_checksum(trainer_model))


def test_the_first_push_is_checked_too():
    policy = RemotePolicy(partial(toy_generator_policy), num_threads=1, timeout=120)
    try:
        with pytest.raises(ValueError, match=r"trainer \[128, 32\], generator \[64, 32\]"):
            policy.update_policy_weights_(toy_causal_lm(**WIDER), policy_version=0)
        assert not policy.started  # the generator was stopped
    finally:
        policy.close()


def test_a_push_into_a_dead_generator_raises_with_its_exit_code(remote):
    policy, trainer_model = remote
    os.kill(policy._process.pid, signal.SIGKILL)
    policy._process.join(timeout=30)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"the generator process died \(exit code -9\)"):
        WeightSyncCallback(policy).push(trainer_model, 1)
    assert time.monotonic() - start < 10


@pytest.mark.parametrize("when", ["copy", "commit"])
def test_a_generator_dying_during_a_push_is_noticed(remote, when):
    """Killed while the weights are copied into the staging buffer, or once the commit is asked
    for: the trainer's step raises with the exit code within seconds, naming the generator."""
    policy, trainer_model = remote
    staging = policy.weight_sync_scheme.staging
    holder, name = (staging, "fill") if when == "copy" else (policy._requests, "put")
    original = getattr(holder, name)

    def then_die(*args, **kwargs):
        out = original(*args, **kwargs)
        os.kill(policy._process.pid, signal.SIGKILL)
        policy._process.join(timeout=30)
        return out

    setattr(holder, name, then_die)
    start = time.monotonic()
    pattern = (
        r"^WeightSyncCallback: the generator process died \(exit code -9\) (before|while "
        "serving) the weights of version 1"
    )
    state = SimpleNamespace(global_step=1, is_world_process_zero=True)
    with pytest.raises(RuntimeError, match=pattern):  # what the trainer calls after a step
        WeightSyncCallback(policy).on_step_end(None, state, None, model=trainer_model)
    assert time.monotonic() - start < 10


PARENT = """
import threading, time
from functools import partial
from types import SimpleNamespace
from torchrl_trl_interop import RemotePolicy
from torchrl_trl_interop.testing import toy_causal_lm, toy_generator_policy

def start(name):
    policy = RemotePolicy(partial(toy_generator_policy), num_threads=1, timeout=120)
    policy.update_policy_weights_(toy_causal_lm(), policy_version=0)
    print(name, policy._process.pid, flush=True)
    time.sleep(600)

toy_causal_lm()  # transformers' lazy imports done here: two threads importing at once can fail
# from a thread that stays alive: no parent-death signal, the generator's own polling must notice
threading.Thread(target=start, args=("thread",), daemon=True).start()
start("main")  # from the main thread: the kernel's parent-death signal applies
"""


def _gone(pid: int) -> bool:
    """The process has exited (reaped, or a zombie nobody reaps in this container)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@background(timeout_s=300)
def trainer_killed(job):
    """A trainer process (``PARENT``) SIGKILLed once its two generators serve: their pids, those
    alive before the kill, and those still alive 10 s after it (Linux: reads /proc)."""
    if not sys.platform.startswith("linux"):
        return None  # its test is skipped
    parent = job.popen([sys.executable, "-c", textwrap.dedent(PARENT)], log="parent.log")
    children: dict[str, int] = {}
    try:
        while len(children) < 2:  # each line once it is whole
            found = re.findall(r"^(thread|main) (\d+)\n", job.log("parent.log"), re.MULTILINE)
            children = {name: int(pid) for name, pid in found}
            if parent.poll() is not None or job.left() < 0:
                raise RuntimeError(f"no generator pids: {job.log('parent.log')[-3000:]}")
            time.sleep(0.1)
        before = {name: pid for name, pid in children.items() if not _gone(pid)}
        parent.kill()  # SIGKILL: no finalizer, no atexit in the trainer
        job.wait(parent)
        deadline = time.monotonic() + 10
        while not all(_gone(pid) for pid in children.values()) and time.monotonic() < deadline:
            time.sleep(0.1)
        return children, before, {name: pid for name, pid in children.items() if not _gone(pid)}
    finally:
        parent.kill()
        for pid in children.values():
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_generators_exit_when_their_trainer_is_killed(trainer_killed):
    children, before, alive = trainer_killed
    assert before == children  # both served before their trainer was killed
    assert not alive, f"generators outlived their killed trainer (started from: {alive})"


def test_delta_pushes_into_a_bf16_generator_are_bit_exact():
    """A bf16 generator fed by an fp32 trainer: one AdamW step at lr 1e-6 sends a tenth of a
    whole push, and the generator holds the trainer's weights cast to bf16 after every push,
    from a model or its state_dict."""
    from tensordict import TensorDict

    policy = RemotePolicy(
        partial(toy_generator_policy, dtype=torch.bfloat16), num_threads=1, timeout=120
    )
    trainer_model = toy_causal_lm(seed=1)
    optimizer = torch.optim.AdamW(trainer_model.parameters(), lr=1e-6)
    sync = WeightSyncCallback(policy, delta=True, full_push_every=4)

    def bf16():
        return weights_checksum(TensorDict.from_module(trainer_model).data.to(torch.bfloat16))

    try:
        sync.push(trainer_model, 0)
        assert policy.weights_checksum() == (0, bf16())
        for step in (1, 2):
            ids = torch.randint(5, 60, (2, 12))
            trainer_model(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            sync.push(trainer_model if step == 1 else trainer_model.state_dict(), step)
            assert policy.weights_checksum() == (step, bf16())
        whole = sync.pushes[0]["bytes"]
        assert [p["delta"] for p in sync.pushes] == [False, True, True]
        assert all(0 < p["bytes"] <= whole / 10 for p in sync.pushes[1:])
        # a whole push in between (no delta): the next delta push starts whole again
        policy.update_policy_weights_(trainer_model, policy_version=3)
        sync.push(trainer_model, 4)
        assert not sync.pushes[-1]["delta"] and policy.weights_checksum() == (4, bf16())
    finally:
        policy.close()


def test_remote_policy_arguments_are_checked():
    for timeout in (-5, 0):
        with pytest.raises(ValueError, match="RemotePolicy: timeout must be a finite number"):
            RemotePolicy(toy_generator_policy, timeout=timeout)
    policy = RemotePolicy(toy_generator_policy)
    with pytest.raises(TypeError, match="RemotePolicy: policy_version must be an int, got '1'"):
        policy.update_policy_weights_(toy_causal_lm(), policy_version="1")
    with pytest.raises(ValueError, match="RemotePolicy: policy_version must be an int >= 0"):
        policy.update_policy_weights_(toy_causal_lm(), policy_version=-3)
    assert not policy.started  # checked before the generator starts
