"""TorchRL LLM environments as the rollout engine of TRL's ``GRPOTrainer`` (``rollout_func=``).

:func:`as_trl_rollout_func` returns the ``rollout_func(prompts, trainer) -> dict`` that
``trl.GRPOTrainer`` calls instead of generating itself: each prompt resets a torchrl
:class:`~torchrl.envs.llm.ChatEnv` (or a ``TransformedEnv`` around one: tools, reward parsers,
environment replies), a torchrl LLM policy answers, and the environment is stepped for up to
``max_turns`` turns (``_episodes``). Every rollout becomes one row of token
ids, log-probs and an environment mask, plus its conversation (``history``) and the reward the
environment computed (``env_reward``), and the policy's last turn (``final_answer``,
``final_answer_ids``: ``_final_answer``), which reach the reward functions as keyword arguments.
"""

from __future__ import annotations

import contextlib
import functools
from typing import TYPE_CHECKING, Any

from tensordict.utils import NestedKey
from torchrl.modules.llm import TransformersWrapper

from .._chat_format import ChatFormat
from .._checks import boundary, check_bool, check_positive_int, is_int, require
from .._keys import NEXT_DONE_KEY, NEXT_REWARD_KEY, POLICY_VERSION_KEY, as_nested_key
from ..weights._staleness import check_max_staleness, check_staleness
from ._dynamic_sampling import check_candidate_group_size, sample_candidates
from ._episodes import RolloutRow, env_reply_roles, find_env_problem, run_episodes
from ._final_answer import FINAL_ANSWER, FINAL_ANSWER_IDS, final_answer_ids, warn_completions_only
from ._policy_checks import check_policy, check_same_tokenizer, check_same_turn_counts
from ._ranks import Lockstep, Ranks, check_prompt_slice, check_same_calls, generation_guard
from ._trainer import (
    global_step,
    group_size,
    log_metrics,
    sampling_temperature,
    trainer_chat_template,
    trainer_eos_ids,
    trainer_generation_config,
    trainer_reward_funcs,
    trainer_tokenizer,
    training_args,
    unwrapped_model,
)
from ._trainer_policy import TrainerModelPolicy, score_tokens
from ._trl_prompts import check_rollout_prompts
from ._vllm import vllm_policy

if TYPE_CHECKING:  # pragma: no cover
    from tensordict.nn import TensorDictModuleBase
    from torchrl.envs import EnvBase

__all__ = ["as_trl_rollout_func"]


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
        max_staleness: int | None = None,
        candidate_group_size: int | None = None,
        env_seed: int | None = None,
    ) -> None:
        self.env = env
        self.env_seed = env_seed
        self._seeded = env_seed is None
        self.max_staleness = max_staleness
        self.candidate_group_size = candidate_group_size
        self.policy = policy
        self.max_turns = max_turns
        self.recompute_logprobs = recompute_logprobs
        self.reward_key = reward_key
        self.done_key = done_key
        self.__name__ = "torchrl_env_rollout"
        #: ((id of the model, chat format), the default policy built around them)
        self._default: tuple[tuple[int, Any], Any] | None = None
        self._checked: set[int] = set()
        self._warned = False
        self._warned_plain_text = False

    def __repr__(self) -> str:
        policy = "trainer model" if self.policy is None else type(self.policy).__name__
        return (
            f"as_trl_rollout_func(env={type(self.env).__name__}, policy={policy}, "
            f"max_turns={self.max_turns})"
        )

    def _recompute(self) -> bool:
        """Whether the trainer's model rescores the policy's tokens after the rollout."""
        if self.policy is None or self.recompute_logprobs is not None:
            return bool(self.recompute_logprobs)
        # torchrl 0.14.1's own wrapper: first-token log-prob is 0.0
        return isinstance(self.policy, TransformersWrapper)

    def _chat_format(self, trainer: Any, tokenizer: Any) -> ChatFormat:
        """How this call's conversations become tokens: the template the policy names, else the
        one the trainer renders with (its tokenizer's own, or TRL's training variant), with the
        trainer's ``chat_template_kwargs``; for several turns, one that renders each
        conversation as its first turns continued (:meth:`ChatFormat.for_turns`)."""
        template, kwargs = trainer_chat_template(trainer)
        names = self.policy is not None and (
            getattr(self.policy, "chat_template", None) is not None
            or getattr(self.policy, "chat_template_name", None) is not None
        )
        if names:
            chat = ChatFormat.of_policy(self.policy, tokenizer, kwargs)
        else:
            chat = ChatFormat.of(tokenizer, chat_template=template, template_kwargs=kwargs)
        if self.max_turns > 1:
            chat = chat.for_turns(env_reply_roles(self.env))
        return chat

    def _policy_for(
        self, trainer: Any, tokenizer: Any, model: Any, ranks: Ranks, chat: ChatFormat
    ) -> tuple[Any, Lockstep | None]:
        """The policy for this call, and the lockstep its generate calls need across ranks."""
        if self.policy is None:
            if self._default is None or self._default[0] != (id(model), chat):
                config = trainer_generation_config(trainer, tokenizer)
                temperature = sampling_temperature(trainer)
                policy = TrainerModelPolicy(
                    model,
                    tokenizer,
                    config,
                    temperature,
                    chat_template=chat.template,
                    chat_template_kwargs=chat.template_kwargs,
                )
                self._default = ((id(model), chat), policy)
            policy = self._default[1]
            policy.synced_gpus = True if ranks.collective else None
            return policy, Lockstep(ranks, policy) if ranks.collective else None
        policy = self.policy
        if id(policy) not in self._checked:
            policy_tokenizer = getattr(policy, "tokenizer", None)
            if policy_tokenizer is not None:
                check_same_tokenizer(policy_tokenizer, tokenizer)
            self._checked.add(id(policy))
        if ranks.collective and getattr(policy, "model", None) is unwrapped_model(trainer):
            raise ValueError(
                f"the policy {type(policy).__name__} generates with the trainer's own model, "
                f"which is sharded over {ranks.count} ranks (ZeRO-3 or FSDP): every forward is "
                "a collective, and its generate calls are neither guarded nor kept in step "
                "across ranks. Leave policy=None: the trainer's model then generates as "
                "GRPOTrainer generates (parameters gathered, synced_gpus, ranks in lockstep)."
            )
        return policy, None

    def _check_prompts(self, prompts: Any, trainer: Any, ranks: Ranks) -> None:
        self._warned_plain_text |= check_rollout_prompts(prompts, warn=not self._warned_plain_text)
        check_prompt_slice(prompts, group_size(trainer), ranks)
        size = self.env.batch_size[0]
        if self.candidate_group_size is None and len(prompts) % size:  # else: the candidates'
            raise ValueError(
                f"got {len(prompts)} prompts for an env of batch_size ({size},); the count "
                "must be a multiple of it. Make generation_batch_size (per process) a "
                "multiple of the env's batch size."
            )

    @boundary("as_trl_rollout_func")
    def __call__(self, prompts: list, trainer: Any) -> dict[str, list]:
        require("transformers", "as_trl_rollout_func")
        ranks = Ranks.of(trainer)
        self._check_prompts(prompts, trainer, ranks)
        if not self._seeded:  # once, before the first reset: each rank its own seed
            self.env.set_seed(self.env_seed + ranks.index)
            self._seeded = True
        if self.candidate_group_size is not None:  # dynamic sampling: K candidates per group
            return sample_candidates(
                self._rollout,
                prompts,
                trainer,
                candidate_group_size=self.candidate_group_size,
                env_batch_size=self.env.batch_size[0],
            )
        return self._rollout(prompts, trainer)

    def _rollout(self, prompts: list, trainer: Any) -> dict[str, list]:
        """One row per prompt entry, in order (the table of :func:`as_trl_rollout_func`)."""
        ranks = Ranks.of(trainer)
        tokenizer = trainer_tokenizer(trainer)
        chat = self._chat_format(trainer, tokenizer)
        stop_ids = trainer_eos_ids(trainer, tokenizer)
        recompute = self._recompute()
        size = self.env.batch_size[0]
        check_same_calls(ranks, {"prompts": len(prompts), "env batch size": size})
        rows: list[RolloutRow] = []
        # the trainer's model, prepared as GRPOTrainer prepares it to generate (ZeRO-3, FSDP)
        # use_vllm=True: TRL's vLLM generates (or this raises)
        vllm = vllm_policy(trainer, self.policy, recompute, ranks)
        uses_model = (self.policy is None and vllm is None) or recompute
        with generation_guard(trainer) if uses_model else contextlib.nullcontext() as model:
            policy, lockstep = (
                (vllm, vllm.lockstep())
                if vllm is not None
                else self._policy_for(trainer, tokenizer, model, ranks, chat)
            )
            for start in range(0, len(prompts), size):
                batch = list(prompts[start : start + size])
                check_same_turn_counts(policy, batch, start)
                rows.extend(
                    run_episodes(
                        self.env,
                        policy,
                        batch,
                        tokenizer,
                        max_turns=self.max_turns,
                        read_logprobs=not recompute,
                        reward_key=self.reward_key,
                        done_key=self.done_key,
                        lockstep=lockstep,
                        chat=chat,
                        stop_ids=stop_ids,
                    )
                )
            if recompute:
                self._rescore(trainer, model, tokenizer, rows)
        answer_ids = [final_answer_ids(r.completion_ids, r.env_mask) for r in rows]
        out = {
            "prompt_ids": [r.prompt_ids for r in rows],
            "completion_ids": [r.completion_ids for r in rows],
            "logprobs": [r.logprobs for r in rows],
            "env_mask": [r.env_mask for r in rows],
            "history": [r.history for r in rows],
            "env_reward": [r.env_reward for r in rows],
            FINAL_ANSWER: chat.decode(answer_ids, skip_special_tokens=True),
            FINAL_ANSWER_IDS: answer_ids,
        }
        versions = [r.policy_version for r in rows]
        every = ranks.gather_versions(versions)  # so that the metrics and the bound are global
        if any(v is not None for v in every):
            out[POLICY_VERSION_KEY] = versions
            step = global_step(trainer)
            log = functools.partial(log_metrics, trainer)
            check_staleness(every, step, self.max_staleness, log=log)
        if self.max_turns > 1 and not self._warned:
            self._warned = True
            warn_completions_only(trainer_reward_funcs(trainer), self.max_turns)
        return out

    @staticmethod
    def _rescore(trainer: Any, model: Any, tokenizer: Any, rows: list[RolloutRow]) -> None:
        """The trainer's model scores the policy's tokens; environment tokens stay at 0.0."""
        args = training_args(trainer)
        scores = score_tokens(
            model,
            [r.prompt_ids + r.completion_ids for r in rows],
            [len(r.prompt_ids) for r in rows],
            temperature=sampling_temperature(trainer),
            pad_token_id=tokenizer.pad_token_id or 0,
            batch_size=max(int(getattr(args, "per_device_train_batch_size", 8) or 8), 1),
        )
        for row, score in zip(rows, scores):
            row.logprobs = [v if m else 0.0 for v, m in zip(score.tolist(), row.env_mask)]


@boundary("as_trl_rollout_func")
def as_trl_rollout_func(
    env: EnvBase,
    *,
    policy: TensorDictModuleBase | None = None,
    max_turns: int = 1,
    recompute_logprobs: bool | None = None,
    reward_key: NestedKey = NEXT_REWARD_KEY,
    done_key: NestedKey = NEXT_DONE_KEY,
    max_staleness: int | None = None,
    candidate_group_size: int | None = None,
    env_seed: int | None = None,
):
    """Turns a TorchRL LLM environment into ``GRPOTrainer``'s rollout engine (``rollout_func=``).

    ``GRPOTrainer`` calls the returned function with this process's prompts, each already repeated
    ``num_generations`` times in a row (strings or TRL message lists, chat template not applied),
    and the trainer. For every batch of ``env.batch_size`` prompts it resets ``env`` with them
    (the ChatEnv's ``data_key``; a string becomes a user turn, a message list is kept as is),
    lets the policy answer, steps the environment, and repeats until every rollout is done or
    ``max_turns`` policy turns were taken. It returns one row per prompt entry, in order:

    ==================== ========================================================================
    key                  value per row
    ==================== ========================================================================
    ``prompt_ids``       the token ids the policy was prompted with at the first turn
    ``completion_ids``   every later token: the policy's turns as sampled, and between two turns
                         the tokens the environment added (tool results, replies, chat markup)
    ``logprobs``         per completion token, the policy's log-prob (0.0 on environment tokens)
    ``env_mask``         per completion token, 1 for a policy token and 0 for an environment token
                         (TRL's tool mask: environment tokens are kept out of the loss)
    ``history``          the whole conversation as TRL messages (tool calls kept), up to the last
                         policy turn
    ``env_reward``       the sum of the environment's rewards (``reward_key``) over the rollout's
                         turns, ``None`` when the environment writes no reward
    ``final_answer``     the policy's last turn, decoded as TRL decodes completions (special tokens
                         skipped); for one turn, the completion's text
    ``final_answer_ids`` that turn's token ids (the last run of policy tokens)
    ==================== ========================================================================

    ``history``, ``env_reward``, ``final_answer`` and ``final_answer_ids`` reach every reward
    function as keyword arguments: ``def env_reward(completions, env_reward, **kw): return
    env_reward`` trains on the environment's reward alone. With ``max_turns > 1``, TRL's ``completions`` is the *whole*
    completion decoded, the environment's text included: wrap stock TRL reward functions with
    :func:`~torchrl_trl_interop.score_final_answer` so they score ``final_answer``; the first
    call warns about reward functions that read only ``completions``.

    Token ids are read by the lengths and masks the policy writes, never by comparing them with
    the pad id: a completion ends with the eos token the policy sampled, as in TRL's own
    generation, also when the tokenizer's pad token is its eos token (GPT-2, Llama-3, Mistral),
    for one turn or several with the default policy. A policy with ``pad_output=True`` has its
    padding cut by its ``("masks", "all_attention_mask")``. Prompts of one environment batch may
    differ in their number of messages (e.g. some with a system message).

    The default policy is a :class:`~torchrl_trl_interop.TrainerModelPolicy` (a torchrl
    ``TransformersWrapper(input_mode="history")``) around the trainer's own model object
    (``trainer.accelerator.unwrap_model(trainer.model)``, never a copy, so it always samples with
    the current weights), generating with the trainer's ``GenerationConfig``
    (``max_completion_length``, ``temperature``, ``top_p``, ``top_k``, ``min_p``,
    ``repetition_penalty``, ``generation_kwargs``), the pad token suppressed when it is not an eos
    token, and cutting each answer after its first eos token as ``GRPOTrainer`` does. Its log-probs
    are those ``GRPOTrainer`` computes (``logits / temperature``, every token: torchrl 0.14.1's
    wrapper writes 0.0 for the first one).

    With ``GRPOConfig(use_vllm=True)`` the default policy generates each turn through TRL's own
    vLLM (``trainer.vllm_generation``: its weight sync and TIS/MIS apply); where it cannot, a
    call raises (:func:`~torchrl_trl_interop.rollouts._vllm.vllm_policy`, :doc:`/distributed`).

    Each turn generates up to ``max_completion_length`` tokens, so a multi-turn completion can be
    up to ``max_turns`` times longer (plus environment tokens): nothing is cut.

    On several processes (``accelerate launch`` / ``torchrun``: DDP, ZeRO, FSDP) each process
    calls it with its own contiguous slice of the generation batch, which may start or end inside
    a group: grouping is TRL's job (it gathers every process's rewards before it normalises them
    per group), and each process returns exactly its own rows, in order. Under ZeRO-3 and FSDP
    the default policy generates as ``GRPOTrainer`` does (parameters gathered, ``synced_gpus``),
    and every process runs the same number of ``generate`` calls, also when its episodes end at
    other turns than another's (see :doc:`/scale`, "The online loop on N ranks").

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
        max_staleness (int, optional): with a policy that stamps ``"policy_version"`` (a
            :class:`~torchrl_trl_interop.RemotePolicy` synced by
            :class:`~torchrl_trl_interop.WeightSyncCallback`, or a torchrl ``PolicyVersion``
            transform), the most optimizer steps a rollout's weights may lag behind the trainer
            (``trainer.state.global_step - policy_version``). A call with an older row raises
            :class:`~torchrl_trl_interop.StaleRolloutError`. Defaults to ``None`` (no bound; the
            staleness is still recorded).
        candidate_group_size (int, optional): dynamic sampling: each group of
            ``num_generations`` prompts is sampled this many times (``>= num_generations``; the
            candidates go through ``env`` in whole batches), scored by the environment's reward
            (``env_reward``), and gets back ``num_generations`` candidates, as sampled, chosen to
            keep its reward spread (the best, the worst, the rest at random). Not uniform: it
            changes the sampling distribution, as DAPO does. Logs ``rollout/candidates``,
            ``rollout/zero_std_groups_before``, ``rollout/zero_std_groups_after`` and
            ``rollout/candidate_reward_mean`` (every candidate's: the policy's). A process
            holding ``n`` rows of a group split across processes samples
            ``ceil(n * candidate_group_size / num_generations)`` candidates for them (see
            :doc:`/online`). Defaults to ``None`` (one rollout per row).
        env_seed (int, optional): seeds ``env`` once, before its first reset, with ``env_seed +
            rank`` (``env.set_seed``; the process index of ``trainer.accelerator``), as
            ``GRPOTrainer`` seeds torch on each rank (``set_seed(seed, device_specific=True)``):
            on several ranks each rank's environment draws its own random numbers. Defaults to
            ``None`` (``env`` is not seeded; a ``ChatEnv`` ignores seeds, and environments that
            draw from torch's generator already differ per rank).

    When the policy stamps versions, every row also has ``policy_version`` (reaching the reward
    functions as a keyword) and the trainer logs ``rollout/staleness_mean`` and
    ``rollout/staleness_max``.

    Returns:
        a callable ``rollout_func(prompts, trainer) -> dict`` for
        ``GRPOTrainer(rollout_func=...)``. Calling it raises ``ValueError`` if the prompt count of
        all processes is not a multiple of ``num_generations`` (or this process's count one of
        the env's batch size), the prompts are not grouped, the processes would run different
        numbers of ``generate`` calls under ZeRO-3/FSDP, the policy's tokenizer is not the trainer's, or a torchrl
        ``TransformersWrapper`` policy gets conversations of different lengths in one env batch
        (torchrl 0.14.1 cannot extend them), or ``candidate_group_size`` does not fit (see
        :doc:`/online`); ``KeyError`` if the policy writes no log-probs (and they are not
        recomputed); ``RuntimeError`` if a multi-turn policy does not continue from
        the tokens it is given.

    Raises:
        TypeError: if ``env`` cannot receive a prompt at reset (not a ChatEnv), ``policy`` is
            not a TensorDict module, ``recompute_logprobs`` not a bool or ``None``, ``env_seed``
            not an int or ``None``, or a key not a key.
        ValueError: if ``env`` is not in history mode, has more than one batch dimension or holds
            a ``DataLoadingPrimer``; if ``max_turns`` is not a positive int, or
            ``candidate_group_size`` not ``None`` or an int ``>= 2``; if ``policy``
            returns no log-probs (``return_log_probs=False``) and ``recompute_logprobs=False``,
            samples several answers per prompt (``num_samples``), has ``prefer_tokens=False``
            with ``max_turns > 1``, or is torchrl's ``TransformersWrapper`` with a tokenizer whose
            pad token is an eos token (torchrl 0.14.1 drops that token from its answers).

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
    problem = find_env_problem(env)
    if problem is not None:
        error, reason = problem
        raise error(f"env cannot take the trainer's prompts at reset: {reason}.")
    check_positive_int(max_turns, "max_turns")
    reward_key = as_nested_key(reward_key, "reward_key")
    done_key = as_nested_key(done_key, "done_key")
    if recompute_logprobs is not None:
        check_bool(recompute_logprobs, "recompute_logprobs")
    if policy is not None:
        check_policy(policy, max_turns, recompute_logprobs)
    check_max_staleness(max_staleness)
    check_candidate_group_size(candidate_group_size)
    if env_seed is not None and not is_int(env_seed):
        raise TypeError(
            "env_seed must be None or an int (each rank seeds env with env_seed + rank), got "
            f"env_seed={env_seed!r}."
        )
    return _EnvRolloutFunc(
        env,
        policy,
        max_turns,
        recompute_logprobs,
        reward_key,
        done_key,
        max_staleness,
        candidate_group_size,
        env_seed,
    )
