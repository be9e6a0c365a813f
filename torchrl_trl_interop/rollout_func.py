"""TorchRL LLM environments as the rollout engine of TRL's ``GRPOTrainer`` (``rollout_func=``).

:func:`as_trl_rollout_func` returns the ``rollout_func(prompts, trainer) -> dict`` that
``trl.GRPOTrainer`` calls instead of generating itself: each prompt resets a torchrl
:class:`~torchrl.envs.llm.ChatEnv` (or a ``TransformedEnv`` around one: tools, reward parsers,
environment replies), a torchrl LLM policy answers, and the environment is stepped for up to
``max_turns`` turns. Every rollout becomes one row of token ids, log-probs and an environment mask,
plus its conversation (``history``) and the reward the environment computed (``env_reward``).

The token sequence is built token-first: the sampled tokens are kept as sampled, the
environment's contribution between two turns is the chat-template text it adds, tokenized once,
and from the second turn on the policy conditions on exactly those tokens (``prefer_tokens``).
So ``prompt_ids + completion_ids`` is what the model saw and produced, and the trainer's own
log-probs of it are the rollout's log-probs.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from tensordict import NonTensorStack, TensorDict, set_list_to_stack
from tensordict.utils import NestedKey, unravel_key
from torchrl.modules.llm import TransformersWrapper

from ._utils import require
from .conversation import history_to_messages, is_message_list, messages_to_history

if TYPE_CHECKING:  # pragma: no cover
    from tensordict.nn import TensorDictModuleBase
    from torchrl.envs import EnvBase

__all__ = ["as_trl_rollout_func"]

_TOKENS_KEY = "tokens"
_LOG_PROBS_KEY = "log_probs"
_HISTORY_KEY = "history"
_REWARD_KEY = ("next", "reward")
_DONE_KEY = ("next", "done")


class _TrainerModelPolicy(TransformersWrapper):
    """``TransformersWrapper`` around the trainer's model, generating with the trainer's settings.

    Two changes to torchrl 0.14.1's wrapper, both in the generate path:

    * log-probs: the wrapper writes 0.0 for the first response token (``_log_probs_generate``
      sets ``[:, 0] = 0``) and scores the raw logits; here every token is scored, on
      ``logits / temperature`` as ``GRPOTrainer`` scores it.
    * generation: the wrapper keeps only the generation arguments it knows (``min_p``,
      ``suppress_tokens``, ``cache_implementation`` ... are dropped silently); here the trainer's
      whole ``GenerationConfig`` is passed to ``generate``. The pad token is suppressed when it is
      not an eos token: the wrapper strips every pad id from responses and token prompts.
    """

    def __init__(self, model: Any, tokenizer: Any, generation_config: Any, temperature: float):
        super().__init__(
            model,
            tokenizer=tokenizer,
            input_mode="history",
            generate=True,
            return_log_probs=True,
            pad_output=False,
            prefer_tokens=True,
        )
        self.temperature = float(temperature)
        generation_config.output_logits = True
        generation_config.return_dict_in_generate = True
        self.generate_kwargs = {"generation_config": generation_config}

    def _log_probs_generate(self, tokens, logits, pad_val=-100, pad: bool = True):
        if pad:
            tokens = torch.nn.utils.rnn.pad_sequence(
                tokens, padding_value=pad_val, batch_first=True, padding_side="left"
            )
            logits = torch.nn.utils.rnn.pad_sequence(
                logits, padding_value=0.0, batch_first=True, padding_side="left"
            )
        scaled = logits.float() / self.temperature
        index = tokens.clamp_min(0).unsqueeze(-1)
        log_probs = scaled.log_softmax(-1).gather(-1, index).squeeze(-1)
        return log_probs.masked_fill(tokens == -100, 0.0), logits


def _trainer_tokenizer(trainer: Any) -> Any:
    tokenizer = getattr(trainer, "_tokenizer", None) or trainer.processing_class
    return getattr(tokenizer, "tokenizer", tokenizer)  # a ProcessorMixin holds its tokenizer


def _generation_config(trainer: Any, tokenizer: Any) -> Any:
    """The trainer's ``GenerationConfig`` (what its own generate uses), with pad suppressed."""
    from transformers import GenerationConfig

    config = getattr(trainer, "generation_config", None)
    if config is not None:
        config = copy.deepcopy(config)
    else:  # vLLM trainers build none: the same settings, from the arguments
        config = GenerationConfig(
            max_new_tokens=trainer.max_completion_length,
            do_sample=True,
            temperature=trainer.temperature,
            top_p=trainer.top_p,
            top_k=trainer.top_k,
            min_p=trainer.min_p,
            repetition_penalty=trainer.repetition_penalty,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=list(trainer.eos_token_ids),
            **(trainer.args.generation_kwargs or {}),
        )
    eos = config.eos_token_id
    eos = set(eos if isinstance(eos, (list, tuple)) else [eos])
    pad = tokenizer.pad_token_id
    if pad is not None and pad not in eos:
        config.suppress_tokens = sorted(set(config.suppress_tokens or []) | {pad})
    return config


def _check_same_tokenizer(policy_tokenizer: Any, trainer_tokenizer: Any) -> None:
    fields = ("pad_token_id", "eos_token_id")
    mismatch = [
        f"{field}: policy {getattr(policy_tokenizer, field)!r}, trainer "
        f"{getattr(trainer_tokenizer, field)!r}"
        for field in fields
        if getattr(policy_tokenizer, field) != getattr(trainer_tokenizer, field)
    ]
    if len(policy_tokenizer) != len(trainer_tokenizer):
        mismatch.append(
            f"vocabulary size: policy {len(policy_tokenizer)}, trainer {len(trainer_tokenizer)}"
        )
    elif policy_tokenizer.get_vocab() != trainer_tokenizer.get_vocab():
        mismatch.append("vocabulary: same size, different token ids")
    if mismatch:
        raise ValueError(
            "as_trl_rollout_func: the policy's tokenizer is not the trainer's processing_class ("
            + "; ".join(mismatch)
            + "). The trainer scores the policy's token ids with its own model, so both must "
            "use one tokenizer: build the policy with tokenizer=trainer.processing_class."
        )


def _transforms(transform: Any) -> list:
    """``transform`` and, for a ``Compose``, everything inside it."""
    if transform is None:
        return []
    inner = getattr(transform, "transforms", None)
    if inner is None:
        return [transform]
    return [transform] + [t for child in inner for t in _transforms(child)]


def _find_env_problem(env: Any) -> str | None:
    """Why ``env`` cannot receive a TRL prompt at reset, or ``None``."""
    from torchrl.envs.llm.transforms.dataloading import DataLoadingPrimer

    base = getattr(env, "base_env", env)
    if not hasattr(base, "data_key") or not hasattr(base, "input_mode"):
        return (
            f"its base environment is a {type(base).__name__}, which reads no prompt at reset; "
            "use a torchrl.envs.llm.ChatEnv (or a TransformedEnv around one)"
        )
    if base.input_mode != "history":
        return (
            f"its ChatEnv has input_mode={base.input_mode!r}; the rollout reads the conversation "
            "as History: build it with input_mode='history'"
        )
    if len(env.batch_size) != 1:
        return f"its batch_size is {tuple(env.batch_size)}; one batch dimension is expected"
    for t in _transforms(getattr(env, "transform", None)):
        if isinstance(t, DataLoadingPrimer):
            return (
                "it holds a DataLoadingPrimer, which replaces the prompt at every reset with one "
                "from its own dataloader; the trainer's dataset serves the prompts here: drop it"
            )
    return None


def _template_kwargs(policy: Any) -> dict[str, Any]:
    names = ("chat_template_name", "chat_template")
    return {n: getattr(policy, n) for n in names if getattr(policy, n, None) is not None}


def _render(history: Any, policy: Any, tokenizer: Any, *, add_generation_prompt: bool) -> list:
    """``history`` (``[B, T]``) rendered with the policy's chat template, as the policy renders it."""
    return history.apply_chat_template(
        tokenizer=getattr(policy, "tokenizer", None) or tokenizer,
        add_generation_prompt=add_generation_prompt,
        **_template_kwargs(policy),
    )


_PROBE = "\x00torchrl_trl_interop\x00"


def _turn_closing(policy: Any, tokenizer: Any) -> str:
    """The text the chat template writes after an assistant turn's content (ChatML: ``<|im_end|>\\n``)."""
    from torchrl.data.llm import History

    probe = History.from_chats([[{"role": "user", "content": "?"}, {"role": "assistant", "content": _PROBE}]])
    text = _render(probe, policy, tokenizer, add_generation_prompt=False)[0]
    return text.split(_PROBE, 1)[1] if _PROBE in text else ""


def _history_row_to_messages(history: Any) -> list[dict[str, Any]]:
    """One conversation as TRL messages; tool calls kept, torchrl's ``<none>`` padding dropped."""
    messages = history_to_messages(history)
    calls = getattr(history, "tool_calls", None)
    calls = calls.tolist() if hasattr(calls, "tolist") else calls
    for message, call in zip(messages, calls or [None] * len(messages)):
        if call:
            message["tool_calls"] = [
                c if "function" in c else {"type": "function", "function": c} for c in call
            ]
    return [m for m in messages if m["role"] != "<none>"]


class _Rollout:
    """One row under construction: prompt, completion (policy and env tokens), reward, history."""

    def __init__(self) -> None:
        self.prompt_ids: list[int] = []
        self.completion_ids: list[int] = []
        self.logprobs: list[float] = []
        self.env_mask: list[int] = []
        self.env_reward: float | None = None
        self.history: Any = None
        self.active = True

    def extend(self, ids: Sequence[int], logprobs: Sequence[float] | None, from_env: bool) -> None:
        self.completion_ids.extend(ids)
        self.logprobs.extend([0.0] * len(ids) if logprobs is None else logprobs)
        self.env_mask.extend([0 if from_env else 1] * len(ids))


class _EnvRolloutFunc:
    """The callable :func:`as_trl_rollout_func` returns (see there)."""

    def __init__(
        self,
        env: EnvBase,
        policy: TensorDictModuleBase | None,
        max_turns: int,
        recompute_logprobs: bool | None,
        reward_key: NestedKey,
        done_key: NestedKey,
    ) -> None:
        self.env = env
        self.policy = policy
        self.max_turns = max_turns
        self.recompute_logprobs = recompute_logprobs
        self.reward_key = unravel_key(reward_key)
        self.done_key = unravel_key(done_key)
        self.__name__ = "torchrl_env_rollout"
        self._default: tuple[int, Any] | None = None  # (id of the model, policy built around it)
        self._checked: set[int] = set()

    def __repr__(self) -> str:
        policy = "trainer model" if self.policy is None else type(self.policy).__name__
        return (
            f"as_trl_rollout_func(env={type(self.env).__name__}, policy={policy}, "
            f"max_turns={self.max_turns})"
        )

    # -- the policy -----------------------------------------------------------------------------

    def _policy_for(self, trainer: Any, tokenizer: Any) -> tuple[Any, bool]:
        """The policy for this call and whether log-probs are recomputed by the trainer's model."""
        if self.policy is None:
            model = trainer.accelerator.unwrap_model(trainer.model)
            if self._default is None or self._default[0] != id(model):
                policy = _TrainerModelPolicy(
                    model, tokenizer, _generation_config(trainer, tokenizer), trainer.temperature
                )
                self._default = (id(model), policy)
            return self._default[1], bool(self.recompute_logprobs)
        policy = self.policy
        if id(policy) not in self._checked:
            policy_tokenizer = getattr(policy, "tokenizer", None)
            if policy_tokenizer is not None:
                _check_same_tokenizer(policy_tokenizer, tokenizer)
            self._checked.add(id(policy))
        recompute = self.recompute_logprobs
        if recompute is None:  # torchrl 0.14.1's own wrapper: first-token log-prob is 0.0
            recompute = isinstance(policy, TransformersWrapper)
        return policy, recompute

    # -- one batch of env.batch_size prompts ----------------------------------------------------

    def _reset(self, prompts: list) -> Any:
        base = getattr(self.env, "base_env", self.env)
        if is_message_list(prompts[0]):
            query = messages_to_history(prompts)
        else:
            query = NonTensorStack(*prompts)
        return self.env.reset(TensorDict({base.data_key: query}, batch_size=self.env.batch_size))

    def _policy_step(self, td: Any, policy: Any, rows: list[_Rollout], turn: int, recompute: bool):
        tokens_key = getattr(policy, "tokens_key", _TOKENS_KEY)
        if turn > 0:  # token-first: the policy continues from exactly the rollout's tokens
            pad = getattr(policy, "padding_value", None)
            sequences = [torch.tensor(r.prompt_ids + r.completion_ids) for r in rows]
            td.set(
                (tokens_key, "prompt"),
                torch.nn.utils.rnn.pad_sequence(
                    sequences, batch_first=True, padding_value=pad, padding_side="left"
                ),
            )
        td = policy(td)
        prompt = td.get((tokens_key, "prompt"), as_list=True)
        response = td.get((tokens_key, "response"), as_list=True)
        logprobs = None
        if not recompute:
            log_probs_key = getattr(policy, "log_probs_key", _LOG_PROBS_KEY)
            logprobs = td.get((log_probs_key, "response"), None, as_list=True)
            if logprobs is None:
                raise KeyError(
                    f"as_trl_rollout_func: the policy {type(policy).__name__} wrote no log-probs "
                    f"at {(log_probs_key, 'response')!r} (keys: "
                    f"{sorted(map(str, td.keys(True, True)))}). Build it with "
                    "return_log_probs=True, or pass recompute_logprobs=True to score the tokens "
                    "with the trainer's model."
                )
        full = td.get((getattr(policy, "history_key", _HISTORY_KEY), "full"))
        for i, row in enumerate(rows):
            if not row.active:
                continue
            ids = prompt[i].tolist()
            if turn == 0:
                row.prompt_ids = ids
            elif ids != row.prompt_ids + row.completion_ids:
                expected = row.prompt_ids + row.completion_ids
                at = next((k for k, (a, b) in enumerate(zip(ids, expected)) if a != b), None)
                raise RuntimeError(
                    f"as_trl_rollout_func: at turn {turn} the policy conditioned on {len(ids)} "
                    f"tokens for rollout {i}, the rollout holds {len(expected)} (first "
                    f"difference at {at}). Multi-turn rollouts need a token-first policy "
                    "(prefer_tokens=True); torchrl 0.14.1's TransformersWrapper strips every "
                    "pad-token id from a token prompt, so the pad token must differ from eos."
                )
            row.extend(response[i].tolist(), None if logprobs is None else logprobs[i].tolist(), False)
            row.history = _history_row_to_messages(full[i])  # now: tools extend it in place
        return td

    def _env_tokens(
        self,
        td: Any,
        policy: Any,
        tokenizer: Any,
        rows: list[_Rollout],
        answered: list[str],
        turn: int,
    ) -> None:
        """Appends, per active row, the tokens the environment added before the next turn.

        ``answered`` is each conversation rendered up to the turn just taken (before the step:
        tool transforms extend that History in place). The environment's text is what the next
        prompt adds to it; before it comes the template's close of the assistant turn, less the
        eos token the policy already generated. Parsed contents are not compared with the
        sampled text (torchrl strips whitespace from parsed answers).
        """
        history = td.get((getattr(policy, "history_key", _HISTORY_KEY), "prompt"))
        texts = _render(history, policy, tokenizer, add_generation_prompt=True)
        closing = _turn_closing(policy, tokenizer)
        for i, row in enumerate(rows):
            if not row.active:
                continue
            if not texts[i].startswith(answered[i]):
                raise ValueError(
                    f"as_trl_rollout_func: after turn {turn} the chat template renders rollout "
                    f"{i}'s next prompt ({texts[i][-200:]!r}) as text that does not extend the "
                    f"conversation so far ({answered[i][-200:]!r}). Multi-turn rollouts need a "
                    "template that renders earlier turns unchanged (templates that drop past "
                    "reasoning do not); use max_turns=1 or such a template."
                )
            close = closing
            last = row.completion_ids[-1] if row.completion_ids else None
            if last in tokenizer.all_special_ids:
                eos_text = tokenizer.decode([last], skip_special_tokens=False)
                if close.startswith(eos_text):
                    close = close[len(eos_text) :]
            text = close + texts[i][len(answered[i]) :]
            row.extend(list(tokenizer(text, add_special_tokens=False)["input_ids"]), None, True)

    def _add_reward(self, td: Any, rows: list[_Rollout]) -> None:
        reward = td.get(self.reward_key, None)
        if reward is None:
            return
        per_row = reward.reshape(len(rows), -1).sum(-1).tolist()
        for row, value in zip(rows, per_row):
            if row.active:
                row.env_reward = (row.env_reward or 0.0) + float(value)

    def _rollout(self, prompts: list, trainer: Any, policy: Any, recompute: bool) -> list[_Rollout]:
        tokenizer = _trainer_tokenizer(trainer)
        rows = [_Rollout() for _ in prompts]
        with set_list_to_stack(True), torch.no_grad():
            td = self._reset(prompts)
            for turn in range(self.max_turns):
                td = self._policy_step(td, policy, rows, turn, recompute)
                last_turn = turn == self.max_turns - 1
                answered = None
                if not last_turn:
                    full = td.get((getattr(policy, "history_key", _HISTORY_KEY), "full"))
                    answered = _render(full, policy, tokenizer, add_generation_prompt=False)
                td = self.env.step(td)
                self._add_reward(td, rows)
                done = td.get(self.done_key, None)
                if done is not None:
                    for row, d in zip(rows, done.reshape(len(rows), -1).any(-1).tolist()):
                        row.active = row.active and not d
                if last_turn or not any(r.active for r in rows):
                    break
                td = self.env.step_mdp(td)
                self._env_tokens(td, policy, tokenizer, rows, answered, turn)
        return rows

    # -- the call TRL makes ---------------------------------------------------------------------

    def _check_prompts(self, prompts: Any, trainer: Any) -> None:
        training = getattr(trainer.model, "training", True)
        group = getattr(trainer, "num_generations" if training else "num_generations_eval", None)
        group = group or getattr(trainer, "num_generations", 1) or 1
        if not isinstance(prompts, (list, tuple)) or not prompts:
            raise TypeError(
                f"as_trl_rollout_func: expected a non-empty list of prompts, got "
                f"{type(prompts).__name__}."
            )
        if len(prompts) % group:
            raise ValueError(
                f"as_trl_rollout_func: got {len(prompts)} prompts, not a multiple of "
                f"num_generations={group}. GRPOTrainer passes every prompt repeated "
                "num_generations times in a row; call the rollout function the same way."
            )
        for start in range(0, len(prompts), group):
            if any(p != prompts[start] for p in prompts[start : start + group]):
                raise ValueError(
                    f"as_trl_rollout_func: prompts {start}..{start + group - 1} are not one "
                    f"prompt repeated num_generations={group} times; GRPOTrainer groups them so."
                )
        size = self.env.batch_size[0]
        if len(prompts) % size:
            raise ValueError(
                f"as_trl_rollout_func: got {len(prompts)} prompts for an env of batch_size "
                f"({size},); the count must be a multiple of it. Make generation_batch_size "
                "(per process) a multiple of the env's batch size."
            )

    def __call__(self, prompts: list, trainer: Any) -> dict[str, list]:
        require("transformers", "as_trl_rollout_func")
        self._check_prompts(prompts, trainer)
        tokenizer = _trainer_tokenizer(trainer)
        policy, recompute = self._policy_for(trainer, tokenizer)
        size = self.env.batch_size[0]
        rows: list[_Rollout] = []
        for start in range(0, len(prompts), size):
            rows.extend(self._rollout(list(prompts[start : start + size]), trainer, policy, recompute))
        if recompute:
            _recompute_logprobs(trainer, rows, tokenizer)
        return {
            "prompt_ids": [r.prompt_ids for r in rows],
            "completion_ids": [r.completion_ids for r in rows],
            "logprobs": [r.logprobs for r in rows],
            "env_mask": [r.env_mask for r in rows],
            "history": [r.history for r in rows],
            "env_reward": [r.env_reward for r in rows],
        }


def _recompute_logprobs(trainer: Any, rows: list[_Rollout], tokenizer: Any) -> None:
    """Scores every row's policy tokens with the trainer's model (``logits / temperature``)."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    device = next(model.parameters()).device
    step = max(int(getattr(trainer.args, "per_device_train_batch_size", 8) or 8), 1)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    with torch.no_grad():
        for start in range(0, len(rows), step):
            chunk = rows[start : start + step]
            sequences = [torch.tensor(r.prompt_ids + r.completion_ids) for r in chunk]
            ids = torch.nn.utils.rnn.pad_sequence(sequences, batch_first=True, padding_value=pad)
            mask = torch.arange(ids.shape[1])[None] < torch.tensor([len(s) for s in sequences])[:, None]
            logits = model(input_ids=ids.to(device), attention_mask=mask.long().to(device)).logits
            scores = (logits.float() / trainer.temperature).log_softmax(-1)
            for row, score, seq in zip(chunk, scores, sequences):
                p, c = len(row.prompt_ids), len(row.completion_ids)
                lp = score[p - 1 : p + c - 1].gather(-1, seq[p:].to(device)[:, None]).squeeze(-1)
                row.logprobs = [v if m else 0.0 for v, m in zip(lp.tolist(), row.env_mask)]


def as_trl_rollout_func(
    env: EnvBase,
    *,
    policy: TensorDictModuleBase | None = None,
    max_turns: int = 1,
    recompute_logprobs: bool | None = None,
    reward_key: NestedKey = _REWARD_KEY,
    done_key: NestedKey = _DONE_KEY,
):
    """Turns a TorchRL LLM environment into ``GRPOTrainer``'s rollout engine (``rollout_func=``).

    ``GRPOTrainer`` calls the returned function with this process's prompts, each already repeated
    ``num_generations`` times in a row (strings or TRL message lists, chat template not applied),
    and the trainer. For every batch of ``env.batch_size`` prompts it resets ``env`` with them
    (the ChatEnv's ``data_key``; a string becomes a user turn, a message list is kept as is),
    lets the policy answer, steps the environment, and repeats until every rollout is done or
    ``max_turns`` policy turns were taken. It returns one row per prompt entry, in order:

    ================== ==========================================================================
    key                value per row
    ================== ==========================================================================
    ``prompt_ids``     the token ids the policy was prompted with at the first turn
    ``completion_ids`` every later token: the policy's turns as sampled, and between two turns
                       the tokens the environment added (tool results, replies, chat markup)
    ``logprobs``       per completion token, the policy's log-prob (0.0 on environment tokens)
    ``env_mask``       per completion token, 1 for a policy token and 0 for an environment token
                       (TRL's tool mask: environment tokens are kept out of the loss)
    ``history``        the whole conversation as TRL messages (tool calls kept), up to the last
                       policy turn
    ``env_reward``     the sum of the environment's rewards (``reward_key``) over the rollout's
                       turns, ``None`` when the environment writes no reward
    ================== ==========================================================================

    ``history`` and ``env_reward`` reach every reward function as keyword arguments, so
    ``def env_reward(completions, env_reward, **kw): return env_reward`` trains on the
    environment's reward alone.

    The default policy is a torchrl ``TransformersWrapper(input_mode="history")`` around the
    trainer's own model object (``trainer.accelerator.unwrap_model(trainer.model)``, never a copy,
    so it always samples with the current weights), generating with the trainer's
    ``GenerationConfig`` (``max_completion_length``, ``temperature``, ``top_p``, ``top_k``,
    ``min_p``, ``repetition_penalty``, ``generation_kwargs``), the pad token suppressed when it is not
    an eos token. Its log-probs are those ``GRPOTrainer`` computes (``logits / temperature``,
    every token: torchrl 0.14.1's wrapper writes 0.0 for the first one).

    Each turn generates up to ``max_completion_length`` tokens, so a multi-turn completion can be
    up to ``max_turns`` times longer (plus environment tokens): nothing is cut.

    Args:
        env (EnvBase): a :class:`~torchrl.envs.llm.ChatEnv` in ``input_mode="history"``, or a
            ``TransformedEnv`` around one (tool, reward, KL transforms...), with one batch
            dimension. It must not hold a ``DataLoadingPrimer``: the trainer serves the prompts.

    Keyword Args:
        policy (TensorDictModuleBase, optional): a torchrl LLM policy in history mode (e.g. a
            ``vLLMWrapper``) using the trainer's tokenizer. From the second turn on it must
            continue from the ``("tokens", "prompt")`` it is given (``prefer_tokens=True``).
            Defaults to the trainer's model, as above.
        max_turns (int, optional): the most policy turns per rollout. Defaults to ``1``.
        recompute_logprobs (bool, optional): score the returned tokens with the trainer's model
            after the rollout (one forward pass) instead of reading the policy's log-probs.
            Defaults to ``None``: ``True`` for a user-given ``TransformersWrapper`` (whose
            first-token log-prob is wrong in torchrl 0.14.1), ``False`` otherwise. TRL uses these
            log-probs only for vLLM importance sampling, which needs the sampler's own.
        reward_key (NestedKey, optional): the environment's reward after a step. Defaults to
            ``("next", "reward")``.
        done_key (NestedKey, optional): the environment's done flag after a step. Defaults to
            ``("next", "done")``.

    Returns:
        a callable ``rollout_func(prompts, trainer) -> dict`` for
        ``GRPOTrainer(rollout_func=...)``. Calling it raises ``ValueError`` if the prompt count is
        not a multiple of ``num_generations`` (or of the env's batch size), the prompts are not
        grouped, or the policy's tokenizer is not the trainer's; ``KeyError`` if the policy
        writes no log-probs (and they are not recomputed); ``RuntimeError`` if a multi-turn policy
        does not continue from the tokens it is given.

    Raises:
        TypeError: if ``env`` cannot receive a prompt at reset (not a ChatEnv).
        ValueError: if ``env`` is not in history mode, has more than one batch dimension or holds
            a ``DataLoadingPrimer``; if ``max_turns`` is not a positive int; if ``policy``
            returns no log-probs (``return_log_probs=False``) and ``recompute_logprobs=False``,
            samples several answers per prompt (``num_samples``), or has ``prefer_tokens=False``
            with ``max_turns > 1``.

    Examples:
        >>> from torchrl.envs.llm import ChatEnv
        >>> from torchrl_trl_interop.testing import toy_tokenizer
        >>> env = ChatEnv(batch_size=(2,), tokenizer=toy_tokenizer(), input_mode="history")
        >>> rollout_func = as_trl_rollout_func(env)
        >>> rollout_func
        as_trl_rollout_func(env=ChatEnv, policy=trainer model, max_turns=1)
        >>> from trl import GRPOConfig, GRPOTrainer  # doctest: +SKIP
        >>> trainer = GRPOTrainer(model, reward_funcs=f, args=GRPOConfig(...),  # doctest: +SKIP
        ...                       train_dataset=prompts, rollout_func=rollout_func)
        >>> trainer.train()  # doctest: +SKIP
    """
    problem = _find_env_problem(env)
    if problem is not None:
        cls = TypeError if "reads no prompt" in problem else ValueError
        raise cls(f"as_trl_rollout_func: env cannot take the trainer's prompts at reset: {problem}.")
    if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
        raise ValueError(f"as_trl_rollout_func: max_turns must be a positive int, got {max_turns!r}.")
    if policy is not None:
        if getattr(policy, "return_log_probs", True) is False and recompute_logprobs is False:
            raise ValueError(
                f"as_trl_rollout_func: the policy {type(policy).__name__} returns no log-probs "
                "(return_log_probs=False) and recompute_logprobs=False; build it with "
                "return_log_probs=True or let the trainer's model score the tokens "
                "(recompute_logprobs=True)."
            )
        if max_turns > 1 and getattr(policy, "prefer_tokens", True) is False:
            raise ValueError(
                f"as_trl_rollout_func: max_turns={max_turns} needs a policy that continues from "
                f"the rollout's tokens, but {type(policy).__name__} has prefer_tokens=False (it "
                "would re-tokenize the conversation, so the trainer would score other tokens "
                "than those sampled). Build it with prefer_tokens=True."
            )
        if getattr(policy, "num_samples", None) not in (None, 1):
            raise ValueError(
                f"as_trl_rollout_func: the policy samples num_samples={policy.num_samples} "
                "answers per prompt; GRPOTrainer already repeats each prompt num_generations "
                "times, so build it with num_samples=None."
            )
    return _EnvRolloutFunc(env, policy, max_turns, recompute_logprobs, reward_key, done_key)
