"""OpenEnv environments in real models' chat formats (issue 53).

* The rollout function over an ``OpenEnvChatEnv`` renders every turn with the tokenizer's own
  template: ``prompt + completion`` is the template's rendering of the conversation the
  environment played, whose rows end at different steps.
* torchrl's placeholder turns never reach messages, datasets or rendered text: an
  ``OpenEnvChatEnv`` whose rows end at different steps fills the finished rows with torchrl's
  ``"<none>"`` turn, as a ``ChatEnv`` batch keeps one length. That turn is no one's message:
  ``history_to_messages``, the torch dataset and both Hugging Face views leave it out, so a chat
  template never renders it into an SFT text.
"""

from __future__ import annotations

import pytest
from _openenv_helpers import last_step_env_class
from tensordict import TensorDict
from torchrl.data import LazyStackStorage, ReplayBuffer

from torchrl_trl_interop import (
    OpenEnvChatEnv,
    TorchRLBufferDataset,
    as_trl_rollout_func,
    history_to_messages,
)
from torchrl_trl_interop.testing import ScriptedChatPolicy, toy_template_tokenizer, toy_tokenizer

pytestmark = pytest.mark.timeout(300)

PROMPTS = ["Finish in 1 steps.", "Finish in 3 steps.", "Finish in 2 steps."]


@pytest.fixture(scope="module")
def rollout():
    env = OpenEnvChatEnv(last_step_env_class(), batch_size=3)
    policy = ScriptedChatPolicy(lambda messages: "ok", tokenizer=toy_tokenizer())
    td = env.reset(TensorDict({"query": PROMPTS}, batch_size=[3]))
    out = env.rollout(3, policy, tensordict=td, auto_reset=False, break_when_all_done=True)
    env.close()
    last = out[:, -1]["next", "history", "prompt"]
    roles = [row.role for row in last.unbind(0)]
    assert any("<none>" in r for r in roles)  # the finished rows are filled with it
    return out


def expected_turns():
    """The conversation each row holds at the end: a user turn, then one answer per step and
    the environment's reply to each but the last."""
    return [
        ["user", "assistant"],
        ["user", "assistant", "user", "assistant", "user", "assistant"],
        ["user", "assistant", "user", "assistant"],
    ]


def test_history_to_messages_leaves_them_out(rollout):
    messages = history_to_messages(rollout[:, -1]["next", "history", "prompt"])
    assert [[m["role"] for m in chat] for chat in messages] == expected_turns()


@pytest.mark.parametrize("view", ["torch", "to_hf_dataset", "as_hf_dataset"])
def test_dataset_views_and_the_sft_text_leave_them_out(rollout, view):
    rb = ReplayBuffer(storage=LazyStackStorage(3))
    rb.extend(rollout[:, -1]["next"].select(("history", "prompt")))
    ds = TorchRLBufferDataset(
        rb, 3, epoch=True, shuffle=False, rename={("history", "prompt"): "messages"}
    )
    if view == "torch":
        rows = list(iter(ds))
        chats = [r["messages"] for r in rows]
    elif view == "to_hf_dataset":
        chats = ds.to_hf_dataset()["messages"]
    else:
        chats = [r["messages"] for r in ds.as_hf_dataset(num_shards=1)]
    assert [[m["role"] for m in chat] for chat in chats] == expected_turns()
    tok = toy_tokenizer()
    for chat in chats:  # what SFTTrainer renders from a "messages" column
        clean = [{k: v for k, v in m.items() if v is not None} for m in chat]
        assert "<none>" not in tok.apply_chat_template(clean, tokenize=False)


@pytest.mark.parametrize("template", ["llama3_1_chat_template", "qwen2_5_chat_template"])
def test_rollouts_are_the_templates_rendering(template):
    """Rows ending at steps 1, 3 and 2, each turn in the template's format, to the token."""
    from types import SimpleNamespace

    import trl.chat_template_utils

    tok = toy_template_tokenizer(getattr(trl.chat_template_utils, template))
    env = OpenEnvChatEnv(last_step_env_class(), batch_size=3)
    policy = ScriptedChatPolicy(lambda messages: "ok", tokenizer=tok)
    trainer = SimpleNamespace(
        state=SimpleNamespace(global_step=0),
        processing_class=tok,
        num_generations=1,
        model=SimpleNamespace(training=True),
        reward_funcs=[],
    )
    prompts = [[{"role": "user", "content": p}] for p in PROMPTS]
    out = as_trl_rollout_func(env, policy=policy, max_turns=3)(prompts, trainer)
    env.close()
    turns = []
    for prompt, completion, history in zip(
        out["prompt_ids"], out["completion_ids"], out["history"]
    ):
        rendered = tok.apply_chat_template(history, tokenize=False)
        ids = tok(rendered, add_special_tokens=False)["input_ids"]
        assert ids[: len(prompt + completion)] == prompt + completion
        turns.append([m["role"] for m in history])
    assert turns == expected_turns()
