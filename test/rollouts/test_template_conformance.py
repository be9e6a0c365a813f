"""Every text chat template TRL ships, through the rollout function, to the token.

The templates are found at run time in the installed TRL (``trl/chat_templates/*.jinja``, the
``*_training`` variants and the templates that do not render a text message aside), each on the
toy vocabulary with its markup as single tokens (:func:`toy_template_tokenizer`). A scripted
policy writes what a model trained on the template writes (a reasoning block where the template
reads one), and the rollout function's tokens are compared with what ``transformers`` renders:

* one turn: the prompt ids are ``apply_chat_template(prompt, add_generation_prompt=True)``;
* two and three turns, the environment replying as a tool or as the user: ``prompt_ids +
  completion_ids`` are the template's rendering of the returned conversation (the tokenizer's
  own template, or TRL's training variant of it, which TRL's tool loop switches to), the
  ``env_mask`` is 1 on exactly the sampled answers, and each answer turn holds what the policy
  wrote; or the rollout refuses at its first call, naming the template, and the refusal is
  justified by ``transformers``' own rendering (the template raises, drops the reply, or renders
  the earlier answer otherwise).
"""

from __future__ import annotations

import functools
import importlib.resources
from types import SimpleNamespace

import pytest
from torchrl.envs import StepCounter
from torchrl.envs.llm import ChatEnv

from torchrl_trl_interop import as_trl_rollout_func
from torchrl_trl_interop.testing import (
    ScriptedChatPolicy,
    toy_template_tokenizer,
    toy_tool_reply,
)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

SYSTEM = {"role": "system", "content": "Answer briefly."}
QUESTION = {"role": "user", "content": "What is 2 plus 3?"}
ANSWERS = ["It is 5.", "Yes, 5.", "Still 5."]
REASONING = "Two plus three."


@functools.lru_cache(maxsize=1)
def text_templates() -> dict[str, str]:
    """The text templates of the installed TRL: name -> template (found at run time)."""
    out = {}
    for entry in sorted((importlib.resources.files("trl") / "chat_templates").iterdir(), key=str):
        if not entry.name.endswith(".jinja") or entry.name.endswith("_training.jinja"):
            continue
        template = entry.read_text()
        tok = toy_template_tokenizer(template)
        try:
            text = tok.apply_chat_template(
                [{"role": "user", "content": "Zq9 marker"}],
                add_generation_prompt=True,
                tokenize=False,
            )
        except Exception:  # noqa: BLE001 - a template that needs more than text (vision)
            continue
        if "Zq9 marker" in text:
            out[entry.name] = template
    return out


def training_variant(tok) -> str | None:
    from trl.chat_template_utils import get_training_chat_template

    try:
        return get_training_chat_template(tok)
    except ValueError:
        return None


def generation_prompt(tok, template=None) -> str:
    chat = [{"role": "user", "content": "?"}]
    bare = tok.apply_chat_template(chat, chat_template=template, tokenize=False)
    text = tok.apply_chat_template(
        chat, chat_template=template, add_generation_prompt=True, tokenize=False
    )
    return text[len(bare) :] if text.startswith(bare) else text


def written(tok, answer: str) -> tuple[str, str]:
    """What a model trained on the tokenizer's template writes for ``answer`` and the content of
    its turn: after a reasoning block where the template reads one (its generation prompt may
    open it: the turn's content then starts with the opening)."""
    prompt = generation_prompt(tok)
    at = prompt.rfind("<think>")
    if at >= 0 and not prompt[at + len("<think>") :].strip():
        text = f"{REASONING}\n</think>\n\n{answer}"
        return text, prompt[at:] + text
    if "</think>" in tok.chat_template and "</think>" not in prompt:
        text = f"<think>\n{REASONING}\n</think>\n\n{answer}"
        return text, text
    return answer, answer


def prompt_for(tok) -> list[dict]:
    """A system message and a question, or the question alone for a template without a system
    role (Gemma 1)."""
    try:
        tok.apply_chat_template([SYSTEM, QUESTION], tokenize=False)
    except Exception:  # noqa: BLE001 - "System role not supported"
        return [QUESTION]
    return [SYSTEM, QUESTION]


def stand_in_trainer(tok):
    """What the rollout function reads of a GRPOTrainer with a policy of the user's."""
    return SimpleNamespace(
        state=SimpleNamespace(global_step=0),
        processing_class=tok,
        num_generations=2,
        model=SimpleNamespace(training=True),
        reward_funcs=[],
    )


def rollout(tok, turns: int, role: str = "tool"):
    env = ChatEnv(batch_size=(2,), tokenizer=tok, input_mode="history")
    if turns > 1:
        env = env.append_transform(toy_tool_reply(role=role))
    env = env.append_transform(StepCounter(max_steps=turns))
    script = [written(tok, a)[0] for a in ANSWERS[:turns]]
    policy = ScriptedChatPolicy(script, tokenizer=tok)
    rollout_func = as_trl_rollout_func(env, policy=policy, max_turns=turns)
    return rollout_func([prompt_for(tok)] * 2, stand_in_trainer(tok))


def ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def stop_id(tok) -> int:
    """The token a model trained on the template ends its turn with (the template's closing)."""
    chat = [{"role": "user", "content": "?"}, {"role": "assistant", "content": "Zq9"}]
    closing = tok.apply_chat_template(chat, tokenize=False).split("Zq9", 1)[1]
    first = ids(tok, closing)[:1]
    return first[0] if first and first[0] in tok.added_tokens_decoder else tok.eos_token_id


@pytest.mark.parametrize("name", list(text_templates()))
def test_one_turn_prompts_as_the_template_renders(name):
    tok = toy_template_tokenizer(text_templates()[name])
    out = rollout(tok, turns=1)
    expected = tok.apply_chat_template(
        prompt_for(tok), add_generation_prompt=True, tokenize=True, return_dict=False
    )
    text, content = written(tok, ANSWERS[0])
    for i in range(2):
        assert out["prompt_ids"][i] == expected, name
        assert out["completion_ids"][i] == ids(tok, text) + [stop_id(tok)]
        assert out["env_mask"][i] == [1] * len(out["completion_ids"][i])
        assert out["history"][i][-1] == {"role": "assistant", "content": content}


def refusal_is_justified(tok, reply_role: str) -> str | None:
    """Why ``transformers``' own rendering of a two-turn conversation cannot be the rollout's
    tokens, with the tokenizer's template and TRL's training variant alike; ``None`` if one of
    them renders it token for token."""
    text, content = written(tok, ANSWERS[0])
    chat = [*prompt_for(tok), {"role": "assistant", "content": content}]
    reasons = []
    for template in (tok.chat_template, training_variant(tok)):
        if template is None:
            continue
        render = functools.partial(tok.apply_chat_template, chat_template=template, tokenize=False)
        try:
            after = render([*chat, {"role": reply_role, "content": "Zq9 reply"}])
        except Exception as err:  # noqa: BLE001 - the template refuses the role
            reasons.append(f"raises {type(err).__name__}")
            continue
        prompt = render(prompt_for(tok), add_generation_prompt=True)
        if "Zq9 reply" not in after:
            reasons.append("drops the reply")
        elif not after.startswith(prompt + text):
            reasons.append("renders the earlier answer otherwise")
        else:
            return None
    return "; ".join(reasons)


def rendered_by(tok, conversation: list[dict], tokens: list[int]) -> str | None:
    """Which template (the tokenizer's own, or TRL's training variant) renders ``conversation``
    as text whose tokens start with ``tokens``; ``None`` if neither does."""
    for label, template in (("own", tok.chat_template), ("training", training_variant(tok))):
        if template is None:
            continue
        text = tok.apply_chat_template(conversation, chat_template=template, tokenize=False)
        full = ids(tok, text)
        if full[: len(tokens)] == tokens:
            return label
    return None


@pytest.mark.parametrize("role,turns", [("tool", 2), ("user", 3)])
@pytest.mark.parametrize("name", list(text_templates()))
def test_turns_are_the_templates_rendering_or_refused(name, role, turns):
    tok = toy_template_tokenizer(text_templates()[name])
    try:
        out = rollout(tok, turns=turns, role=role)
    except ValueError as err:
        message = str(err)
        assert name in message, message  # the refusal names the template
        why = refusal_is_justified(tok, role)
        assert why, f"{name} refused a {role} reply that transformers renders: {message}"
        return
    stop = stop_id(tok)
    for i in range(2):
        prompt, completion = out["prompt_ids"][i], out["completion_ids"][i]
        history = out["history"][i]
        assert rendered_by(tok, history, prompt + completion), (name, i)
        # exactly the sampled answers are the model's, in order
        model_tokens = [t for t, m in zip(completion, out["env_mask"][i]) if m]
        sampled = [t for a in ANSWERS[:turns] for t in ids(tok, written(tok, a)[0]) + [stop]]
        assert model_tokens == sampled
        # each answer turn holds what the policy wrote, after what its prompt opened it with
        answers = [m["content"] for m in history if m["role"] == "assistant"]
        texts = [written(tok, a)[0] for a in ANSWERS[:turns]]
        assert all(
            a.endswith(t) and a[: -len(t)] in ("", "<think>\n") for a, t in zip(answers, texts)
        )
        replies = [m for m in history[len(prompt_for(tok)) :] if m["role"] == role]
        assert len(replies) == turns - 1


def test_every_kind_of_template_is_covered():
    """The conformance suite sees the families the issue names (found in the installed TRL)."""
    names = set(text_templates())
    for family in ("gemma", "phi3", "llama3", "deepseek", "glm4moe", "cohere", "gptoss", "qwen3"):
        assert any(n.startswith(family) for n in names), family


class RecordingRollout:
    """Wraps a rollout function and keeps each call's prompts and output."""

    def __init__(self, rollout_func):
        self.rollout_func = rollout_func
        self.calls = []

    def __call__(self, prompts, trainer):
        out = self.rollout_func(prompts, trainer)
        self.calls.append((prompts, out))
        return out


def stop_bias(model, ids: list[int], bias: float = 3.0):
    """Adds ``bias`` to the logits of ``ids``, so that the random model ends turns with them."""
    import torch

    def hook(module, args, logits):
        added = torch.zeros(logits.shape[-1], dtype=logits.dtype)
        return logits + added.index_fill_(0, torch.tensor(ids), bias)

    model.get_output_embeddings().register_forward_hook(hook)
    return model


def env_reward(completions, env_reward=None, **kwargs):
    return [0.0 if r is None else float(r) for r in env_reward]


class TestGRPOTrainer:
    """Real ``GRPOTrainer.train()`` runs in real models' formats, the trainer's model sampling
    (random tokens: compared as text, token for token where the model ended its turn as the
    template does)."""

    @staticmethod
    def train(tmp_path, tok, model, env, max_turns):
        from datasets import Dataset
        from trl import GRPOConfig, GRPOTrainer

        from torchrl_trl_interop.testing import toy_grpo_args

        recorder = RecordingRollout(as_trl_rollout_func(env, max_turns=max_turns))
        prompts = [[QUESTION], [{"role": "user", "content": "What is 4 plus 1?"}]]
        args = toy_grpo_args(tmp_path, tokenizer=tok, max_steps=2, max_completion_length=5)
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=env_reward,
            args=GRPOConfig(**args),
            train_dataset=Dataset.from_dict({"prompt": prompts * 4}),
            processing_class=tok,
            rollout_func=recorder,
        )
        trainer.train()
        assert trainer.state.global_step == 2
        return recorder.calls

    @staticmethod
    def rows(tok, calls):
        """Every row of the recorded calls whose prompt ids are the template's rendering of its
        prompt (asserted), as ``(prompt ids, completion ids, env mask, history)``; rows whose
        answers carry spaces around them left out (Llama 3's and Gemma's templates trim an
        answer: a random model's spaces go)."""
        for prompts, out in calls:
            for prompt, ids, completion, mask, history in zip(
                prompts, out["prompt_ids"], out["completion_ids"], out["env_mask"], out["history"]
            ):
                rendered = tok.apply_chat_template(
                    prompt, add_generation_prompt=True, tokenize=False
                )
                assert ids == tok(rendered, add_special_tokens=False)["input_ids"]
                answers = [m["content"] for m in history if m["role"] == "assistant"]
                if all(a == a.strip() for a in answers):
                    yield ids, completion, mask, history

    def test_llama3_tool_turns_with_several_stop_ids(self, tmp_path):
        """Llama 3.1: bos written by the template and by the tokenizer (once in the prompt),
        turns ended by ``<|eot_id|>`` or ``<|end_of_text|>`` (the generation config's list)."""
        from trl.chat_template_utils import llama3_1_chat_template

        from torchrl_trl_interop.testing import toy_causal_lm

        tok = toy_template_tokenizer(llama3_1_chat_template, adds_bos=True)
        tok.add_special_tokens(
            {"additional_special_tokens": ["<|end_of_text|>"]}, replace_extra_special_tokens=False
        )
        end_of_text = tok.convert_tokens_to_ids("<|end_of_text|>")
        model = stop_bias(toy_causal_lm(tokenizer=tok), [end_of_text, tok.eos_token_id])
        model.generation_config.eos_token_id = [end_of_text, tok.eos_token_id]
        env = ChatEnv(batch_size=(4,), tokenizer=tok, input_mode="history")
        env = env.append_transform(toy_tool_reply()).append_transform(StepCounter(max_steps=2))
        calls = self.train(tmp_path, tok, model, env, max_turns=2)

        ended = {"<|eot_id|>": 0, "<|end_of_text|>": 0}
        for ids, completion, mask, history in self.rows(tok, calls):
            assert ids.count(tok.bos_token_id) == 1
            first_answer_end = mask.index(0) - 1 if 0 in mask else None
            if first_answer_end is None:
                continue
            stop = tok.convert_ids_to_tokens(completion[first_answer_end])
            text = tok.decode(ids + completion, skip_special_tokens=False)
            if stop in ended:
                ended[stop] += 1
                # another stop token than the template's stands for it (TRL aligns on eos)
                text = text.replace("<|end_of_text|>", "<|eot_id|>")
            full = tok.apply_chat_template(history, tokenize=False)
            assert full.startswith(text), (text[-120:], full[-160:])
        assert all(ended.values()), ended  # both stop tokens ended a turn somewhere

    def test_gemma_user_turns_end_of_turn_is_not_eos(self, tmp_path):
        """Gemma 3: eos is ``<eos>``, a turn ends with ``<end_of_turn>`` (in the generation
        config's list), the environment replies as the user."""
        from trl.chat_template_utils import gemma3_chat_template

        from torchrl_trl_interop.testing import toy_causal_lm

        tok = toy_template_tokenizer(gemma3_chat_template, eos_token="<eos>")
        end_of_turn = tok.convert_tokens_to_ids("<end_of_turn>")
        model = stop_bias(toy_causal_lm(tokenizer=tok), [end_of_turn])
        model.generation_config.eos_token_id = [tok.eos_token_id, end_of_turn]
        env = ChatEnv(batch_size=(4,), tokenizer=tok, input_mode="history")
        reply = toy_tool_reply("Try again ({n}).", role="user")
        env = env.append_transform(reply).append_transform(StepCounter(max_steps=2))
        calls = self.train(tmp_path, tok, model, env, max_turns=2)

        checked = 0
        for ids, completion, mask, history in self.rows(tok, calls):
            if 0 not in mask or completion[mask.index(0) - 1] != end_of_turn:
                continue
            text = tok.decode(ids + completion, skip_special_tokens=False)
            assert tok.apply_chat_template(history, tokenize=False).startswith(text)
            assert [m["role"] for m in history] == ["user", "assistant", "user", "assistant"]
            checked += 1
        assert checked


@pytest.mark.parametrize("padding_side", ["left", "right"])
@pytest.mark.parametrize("pad", ["own pad", "pad is eos"])
@pytest.mark.parametrize("template", ["llama3_1_chat_template", "qwen2_5_chat_template"])
def test_tokenizer_layouts(template, pad, padding_side):
    """The trainer's model policy on real layouts: pad other than eos or the eos itself, left or
    right padding: prompts are the template's rendering, two turns continue from the tokens."""
    import torch
    import trl.chat_template_utils
    from transformers import GenerationConfig

    from torchrl_trl_interop import TrainerModelPolicy
    from torchrl_trl_interop.testing import toy_causal_lm

    chat_template = getattr(trl.chat_template_utils, template)
    tok = toy_template_tokenizer(chat_template, padding_side=padding_side)
    if pad == "pad is eos":
        tok.pad_token = tok.eos_token
    model = stop_bias(toy_causal_lm(tokenizer=tok), [tok.eos_token_id], bias=2.0)
    config = GenerationConfig(
        max_new_tokens=6,
        do_sample=True,
        eos_token_id=[tok.eos_token_id],
        pad_token_id=tok.pad_token_id,
        output_logits=True,
        return_dict_in_generate=True,
    )
    policy = TrainerModelPolicy(model, tok, config, temperature=1.0)
    env = ChatEnv(batch_size=(4,), tokenizer=tok, input_mode="history")
    env = env.append_transform(toy_tool_reply()).append_transform(StepCounter(max_steps=2))
    rollout_func = as_trl_rollout_func(env, policy=policy, max_turns=2, recompute_logprobs=False)
    prompts = [[QUESTION]] * 2 + [[SYSTEM, QUESTION]] * 2  # groups of 2, of different lengths
    torch.manual_seed(0)
    out = rollout_func(prompts, stand_in_trainer(tok))
    for prompt, ids, completion, mask in zip(
        prompts, out["prompt_ids"], out["completion_ids"], out["env_mask"]
    ):
        expected = tok.apply_chat_template(
            prompt, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        assert ids == expected
        answers = [t for t, m in zip(completion, mask) if m]
        assert tok.pad_token_id not in answers or pad == "pad is eos"
        if 0 in mask:  # the first answer ended (at eos or the length limit), then the env's turn
            first = completion[: mask.index(0)]
            assert len(first) <= 6 and tok.eos_token_id not in first[:-1]
