"""Chat-environment resets and steps without torchrl's detours: the same as torchrl's.

``_upstream._env_step.reset`` lays a reset's ``ChatHistory`` out once, ``step`` skips
``Transform.inv``'s copy of the input when no transform inverts anything, and ``step_mdp``
carries entries over without copying them. On real torchrl chat environments (tools, step
counters, reward transforms) every reset, step output and next input must equal ``env.reset``'s,
``env.step``'s and ``env.step_mdp``'s, the input must keep its entries, and an environment with
an inverse transform, a system prompt or a reset preprocessing must go through torchrl.
"""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict, is_tensor_collection, set_list_to_stack
from tensordict.nn import TensorDictModuleBase
from test_policy_output import _layout
from torchrl.envs import StepCounter, Transform, TransformedEnv, UnsqueezeTransform
from torchrl.envs.llm import ChatEnv

from torchrl_trl_interop import RewardTransform, history_to_messages, messages_to_history
from torchrl_trl_interop._keys import placeholder_turn
from torchrl_trl_interop._upstream._env_step import (
    _flat_step_mdp,
    _plain_reset,
    _plain_step,
    inverts,
    reset,
    step,
    step_mdp,
)
from torchrl_trl_interop.rollouts._episodes import _same_length
from torchrl_trl_interop.testing import (
    ScriptedChatPolicy,
    toy_answer_length,
    toy_calculator_env,
    toy_chat_env,
    toy_generator_policy,
    toy_tool_call,
    toy_tool_env,
)

#: every test runs on both branches of the _upstream speed paths (fast and plain upstream)
pytestmark = pytest.mark.usefixtures("upstream_branch")

ENVS = {
    "SimpleToolTransform, StepCounter, reward when done": (
        lambda: toy_tool_env(batch_size=2),
        [toy_tool_call(2, 3), "2 plus 3 is 5."],
    ),
    "tool reply, StepCounter, reward transform": (
        lambda: toy_chat_env(
            batch_size=3,
            reply=True,
            max_steps=2,
            transforms=[RewardTransform(toy_answer_length)],
        ),
        ["one", "two words"],
    ),
    "calculator tool, StepCounter, TRL rewards every turn": (
        lambda: toy_calculator_env(max_steps=2),
        [toy_tool_call(2, 3), "5"],
    ),
}


def leaves(td) -> list[str]:
    return sorted(map(str, td.keys(True, True, is_leaf=lambda c: not is_tensor_collection(c))))


def toy_model_policy(answers):
    """The online loop's default policy (a toy model's ``TrainerModelPolicy``): dense output."""
    return toy_generator_policy(max_new_tokens=4)


class DenseHistory(TensorDictModuleBase):
    """The toy model's policy, its conversation so far as one dense History (the layout of
    ``messages_to_history``, which tool transforms extend in place)."""

    def __init__(self, answers):
        super().__init__()
        self.policy, self.in_keys, self.out_keys = toy_model_policy(answers), [], []

    def forward(self, td):
        td = self.policy(td)
        # the messages are the real turns: filled again to one length with torchrl's placeholder
        chats = _same_length(history_to_messages(td["history", "full"]))
        td.set(("history", "full"), messages_to_history(chats))
        return td


POLICIES = {
    "scripted (lazy stacks)": ScriptedChatPolicy,
    "toy model (dense)": toy_model_policy,
    "toy model, dense History": DenseHistory,
}


def queries(n: int, form: str):
    """``n`` prompts as text, or as conversations of different lengths (a ``[n, T]`` History:
    what the online loop resets with, the shorter ones filled with torchrl's placeholder)."""
    if form == "text":
        return ["What is 2 plus 3?"] * n
    system = {"role": "system", "content": "Be brief."}
    chats = [
        [system] * (i % 2) + [{"role": "user", "content": "What is 2 plus 3?"}] for i in range(n)
    ]
    return messages_to_history([c + [placeholder_turn()] * (2 - len(c)) for c in chats])


def episode(
    env, answers, stepper, mover, make_policy=ScriptedChatPolicy, resetter=None, form="text"
) -> list[dict]:
    """Every step's outcome (reward, done, next prompt, the input's own entries afterwards) and
    the next step's input."""
    policy = make_policy(answers)
    torch.manual_seed(0)
    resetter = resetter or (lambda e, td: e.reset(td))
    out = []
    with set_list_to_stack(True), torch.no_grad():
        query = queries(env.batch_size[0], form)
        td = resetter(env, TensorDict({"query": query}, batch_size=env.batch_size))
        for _ in answers:
            td = policy(td)
            before = history_to_messages(td["history", "full"])
            td = stepper(env, td)
            out.append(
                {
                    "reward": td.get(("next", "reward"), None),
                    "done": td["next", "done"].clone(),
                    "next prompt": history_to_messages(td["next", "history", "prompt"]),
                    "next keys": sorted(map(str, td["next"].keys(True, True))),
                    "input full, after": history_to_messages(td["history", "full"]),
                    "input full, before": before,
                }
            )
            td = mover(env, td)
            out[-1]["next input"] = leaves(td)
            out[-1]["next input prompt"] = history_to_messages(td["history", "prompt"])
            out[-1]["next input, tensors"] = tensors(td)
    return out


def tensors(td) -> dict:
    """Every tensor of ``td``, ragged ones (rows of different lengths) as lists of rows."""
    out = {}
    for key in td.keys(True, True):
        try:
            value = td.get(key)
        except RuntimeError:  # rows of different lengths
            value = td.get(key, as_list=True)
        if isinstance(value, torch.Tensor) and value.layout == torch.strided:
            out[key] = value.clone()
        elif isinstance(value, list) and all(isinstance(v, torch.Tensor) for v in value):
            out[key] = [v.clone() for v in value]
    return out


@pytest.mark.parametrize("form", ["text", "messages"])
@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("name", list(ENVS))
def test_same_step_as_torchrl(name, policy, form):
    make, answers = ENVS[name]
    env = make()
    assert _plain_step(env) and _flat_step_mdp(env) and _plain_reset(env)  # the fast paths
    ours = episode(env, answers, step, step_mdp, POLICIES[policy], reset, form)
    theirs = episode(
        make(),
        answers,
        lambda e, td: e.step(td),
        lambda e, td: e.step_mdp(td),
        POLICIES[policy],
        form=form,
    )
    assert len(ours) == len(answers)
    for mine, reference in zip(ours, theirs):
        assert mine["next prompt"] == reference["next prompt"]
        assert mine["next keys"] == reference["next keys"]
        torch.testing.assert_close(mine["done"], reference["done"])
        if reference["reward"] is None:
            assert mine["reward"] is None
        else:
            torch.testing.assert_close(mine["reward"], reference["reward"])
        assert mine["input full, after"] == mine["input full, before"]  # the input kept
        assert mine["next input"] == reference["next input"]
        assert (
            "next" not in mine["next input"]
            and "('history', 'full', 'role')" not in mine["next input"]
        )
        assert mine["next input prompt"] == reference["next input prompt"] == mine["next prompt"]
        torch.testing.assert_close(mine["next input, tensors"], reference["next input, tensors"])
    if policy.startswith("scripted"):
        assert ours[-1]["done"].all()  # the episodes ended as scripted
        reply = ours[0]["next prompt"][0][-1]  # a tool ran: its reply is in the next prompt
        assert reply["role"] == "tool" and ("5" in reply["content"] or "reply" in name)


class WritesOnInverse(Transform):
    """An inverse transform that writes into the step's input."""

    def _inv_call(self, tensordict):
        tensordict.set("seen_by_inverse", torch.ones(tensordict.shape, dtype=torch.bool))
        return tensordict


def test_an_inverse_transform_steps_through_torchrl():
    """With an inverse, the input is copied first (``env.step``): nothing is written into it."""
    make, answers = ENVS["tool reply, StepCounter, reward transform"]
    env = make().append_transform(WritesOnInverse())
    assert inverts(env.transform) and not _plain_step(env)
    with set_list_to_stack(True), torch.no_grad():
        td = env.reset(TensorDict({"query": ["Hi"] * 3}, batch_size=[3]))
        td = step(env, ScriptedChatPolicy(answers)(td))
    assert "seen_by_inverse" not in td.keys() and ("next", "done") in td.keys(True)


def test_inverts():
    env = toy_chat_env(reply=True, max_steps=2)
    assert not inverts(env.transform) and not inverts(None)
    assert inverts(UnsqueezeTransform(-1, in_keys_inv=["action"]))
    assert inverts(env.append_transform(WritesOnInverse()).transform)  # inside a Compose


def test_next_history_is_torchrls_in_new_containers():
    """``_next_history`` lays the next prompt out as torchrl's step does, over the same
    leaves, in new containers: a tool transform extending it in place leaves the input alone."""
    from torchrl.data.llm import History

    from torchrl_trl_interop._upstream._env_step import _next_history

    env = toy_tool_env(batch_size=2)
    with set_list_to_stack(True), torch.no_grad():
        td = env.reset(TensorDict({"query": ["What is 2 plus 3?"] * 2}, batch_size=[2]))
        td = toy_model_policy(None)(td)
        ours, theirs = _next_history(env.base_env, td), env.base_env._step(td)
        full = td["history"].full
        assert _layout(ours) == _layout(theirs)
        prompt = ours["history"].prompt
        assert history_to_messages(prompt) == history_to_messages(theirs["history"].prompt)
        assert prompt is not full and prompt._tensordict is not full._tensordict
        rows, input_rows = prompt._tensordict.tensordicts, full._tensordict.tensordicts
        assert all(a is not b for a, b in zip(rows, input_rows))
        before = history_to_messages(full)
        reply = History(role=["tool"] * 2, content=["5", "5"], batch_size=(2,)).unsqueeze(-1)
        prompt.extend(reply, dim=-1)  # as torchrl's tool transforms do, in place
        assert history_to_messages(full) == before
        assert [m[-1]["role"] for m in history_to_messages(prompt)] == ["tool", "tool"]


@pytest.mark.parametrize("form", ["text", "messages"])
@pytest.mark.parametrize("name", list(ENVS))
def test_same_reset_as_torchrl(name, form):
    """The input comes back with torchrl's entries, laid out as torchrl lays them out (each
    row's prompt is the conversation's own row), with the same values."""
    make = ENVS[name][0]
    envs = make(), make()
    with set_list_to_stack(True), torch.no_grad():
        inputs = [
            TensorDict({"query": queries(e.batch_size[0], form)}, batch_size=e.batch_size)
            for e in envs
        ]
        ours, theirs = reset(envs[0], inputs[0]), envs[1].reset(inputs[1])
        assert ours is inputs[0] and theirs is inputs[1]
        assert _layout(ours) == _layout(theirs)
        assert leaves(ours) == leaves(theirs)
        torch.testing.assert_close(tensors(ours), tensors(theirs))
        prompts = [history_to_messages(td["history"].prompt) for td in (ours, theirs)]
        assert prompts[0] == prompts[1]
        if form == "messages":
            assert prompts[0] == history_to_messages(inputs[0]["query"])
            rows = ours["history"]._tensordict.tensordicts
            query_rows = ours["query"]._tensordict.tensordicts
            assert all(r["prompt"]._tensordict is q for r, q in zip(rows, query_rows))


class PreprocessesReset(Transform):
    """A transform that rewrites the reset's input (as a ``DataLoadingPrimer`` does)."""

    def _reset_env_preprocess(self, tensordict):
        return tensordict


def test_other_resets_go_through_torchrl():
    """A system prompt, a transform preprocessing the reset, a plain ``ChatEnv``: ``env.reset``.
    So does a query in another form, or a partial reset."""
    system = TransformedEnv(
        ChatEnv(batch_size=(2,), input_mode="history", system_prompt="Be brief."), StepCounter()
    )
    assert not _plain_reset(system)
    assert not _plain_reset(toy_chat_env(batch_size=2).append_transform(PreprocessesReset()))
    assert not _plain_reset(ChatEnv(batch_size=(2,), input_mode="history"))
    env = toy_chat_env(batch_size=2, max_steps=2)
    assert _plain_reset(env)
    with set_list_to_stack(True), torch.no_grad():
        td = reset(system, TensorDict({"query": queries(2, "messages")}, batch_size=[2]))
        assert history_to_messages(td["history"].prompt)[0][0]["content"] == "Be brief."
        partial = TensorDict(
            {"query": queries(2, "messages"), "_reset": torch.tensor([[True], [True]])},
            batch_size=[2],
        )
        assert reset(env, partial)["step_count"].flatten().tolist() == [0, 0]
