"""TRL rewards inside TorchRL environments: :class:`RewardTransform`.

:class:`RewardTransform` takes TRL reward functions (such as ``trl.rewards.think_format_reward``,
wrapped in a :class:`~torchrl_trl_interop.TRLRewardFuncWrapper` for it) or any reward TensorDict
module of this package (:class:`~torchrl_trl_interop.HFRewardModelWrapper`), runs it each time
the policy ends an assistant turn, and writes the score as the environment's reward,
``("next", "reward")``, where collectors, ``MCAdvantage`` and losses read it.
:func:`as_reward_transform`, the same call spelled as a function, is deprecated.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from tensordict import TensorDictBase, set_list_to_stack
from tensordict.nn import TensorDictModuleBase
from tensordict.utils import NestedKey
from torchrl.data import Composite, Unbounded
from torchrl.envs.transforms import Transform, TransformedEnv

from .._checks import (
    as_names,
    boundary,
    check_bool,
    check_keywords,
    public_call,
    signed,
    speaking_for,
)
from .._deprecation import warn_deprecated
from .._keys import (
    DONE_KEY,
    HISTORY_KEY,
    PLACEHOLDER_ROLE,
    REWARD_KEY,
    as_nested_key,
    key_parts,
    keys_present,
)
from .._upstream._env_step import flat_transforms
from .._upstream._history_fields import history_fields
from ._from_trl import TRLRewardFuncWrapper
from ._input_mode import CHAT_MODES, resolve_input_mode
from ._scoring import check_nonfinite
from ._to_trl import module_reward_key as _module_reward_key

__all__ = ["RewardTransform", "as_reward_transform"]

#: the arguments that configure TRL reward functions (a TensorDict module is configured on its own)
_FUNC_ARGS = ("prompt_key", "completion_key", "completion_ids_key", "kwargs_keys", "weights")


class RewardTransform(Transform):
    """Scores every assistant turn with TRL reward functions or a reward module, and writes it as
    ``("next", reward_key)``.

    At each ``env.step`` the transform reads the step's input (the policy's output: the
    conversation ending with the turn just generated), runs the reward on the rows to score,
    without gradients, and writes it to the step's output. Its shape is that of a reward already
    there, else ``[*batch, 1, 1]`` as torchrl's LLM reward parsers (``GSM8KRewardParser``) write
    it: a token and a feature dimension, so that ``MCAdvantage``'s advantage broadcasts over the
    tokens in ``GRPOLoss``. The reward spec is added with that shape if the environment has none.

    The step is read in one of ``ChatEnv``'s two forms, ``input_mode``: ``"history"`` (a row is
    scored when its last turn at ``history_key`` has one of the ``completion_roles``) or
    ``"text"`` (every row is scored; TRL reward functions read ``prompt_key`` and
    ``completion_key``). With ``only_done=True``, a row is scored only when the step ends its
    episode (a sparse, trajectory-level reward). Other rows get ``0.0``. A scored row whose reward
    is not finite (TRL reward functions all returning ``None`` for it: ``NaN``) follows
    ``nonfinite``, as in :class:`~torchrl_trl_interop.HFRewardModelWrapper`: by default an
    error, since ``MCAdvantage`` spreads one ``NaN`` over its whole group and ``GRPOLoss`` is
    then ``NaN``.

    Args:
        module (TRL reward function(s) or TensorDictModuleBase): TRL reward functions
            ``f(prompts, completions, completion_ids, **kwargs)`` (one, or a list, weighted by
            ``weights``), run through a :class:`~torchrl_trl_interop.TRLRewardFuncWrapper`; or a
            TensorDict module that writes one reward per row, e.g.
            ``HFRewardModelWrapper(model, tokenizer=rm_tok, input_mode="history")``.

    Keyword Args:
        input_mode (str, optional): ``"history"`` or ``"text"``, the environment's
            (``ChatEnv(input_mode=...)``). Defaults to ``None``: ``"text"`` if ``prompt_key`` and
            ``completion_key`` are given, else ``"history"``.
        history_key (NestedKey or None, optional): the conversation (``"history"`` mode), read
            to tell whether a turn ended with a completion role, and by TRL reward functions.
            ``None`` scores every row. Defaults to ``("history", "full")``, what torchrl's LLM
            wrappers write.
        reward_key (NestedKey, optional): the reward entry written in the step's output
            (``("next", reward_key)`` of the rollout). Defaults to ``"reward"``.
        module_reward_key (NestedKey, optional): where the module writes its reward. Defaults to
            the module's only ``out_keys`` entry, else ``"reward"``.
        completion_roles (sequence of str, optional): roles that end a scored turn. Defaults to
            ``("assistant",)``.
        only_done (bool, optional): score only steps that end the episode. The transform reads
            ``done`` where it runs, so append it *after* the transforms that end episodes
            (``StepCounter(max_steps=...)``): before one, it raises at the first reset or step.
            Defaults to ``False``.
        done_key (NestedKey, optional): the done flag in the step's output. Defaults to ``"done"``.
        accumulate (bool, optional): add to a reward another transform already wrote instead of
            refusing to overwrite it. Defaults to ``False``.
        weights (list of float, optional): one weight per TRL reward function, as
            ``GRPOConfig.reward_weights``. Defaults to ``1.0`` each.
        prompt_key, completion_key (NestedKey, optional): the prompt and completion strings TRL
            reward functions read in ``"text"`` mode. Default to ``("text", "prompt")`` and
            ``("text", "response")`` there.
        completion_ids_key (NestedKey, optional): completion token ids for TRL reward
            functions. Defaults to ``None``.
        kwargs_keys (dict, optional): ``{kwarg name: key}`` passed to TRL reward functions.
        nonfinite (str, optional): what to do when a scored row's reward is ``NaN`` (no TRL
            function scored it: all returned ``None``) or infinite: ``"raise"`` a
            :class:`ValueError` naming the rows, ``"warn"`` (:class:`RuntimeWarning`) and write
            it, or ``"ignore"``. Defaults to ``"raise"``.

    Raises:
        TypeError: if ``module`` is neither a ``TensorDictModuleBase`` nor TRL reward functions
            (a model needs :class:`~torchrl_trl_interop.HFRewardModelWrapper`), a TRL-function
            argument (``weights``, ``prompt_key``, ...) is given with a module, or a key or flag
            has the wrong type.
        ValueError: if ``input_mode`` is not ``"history"`` or ``"text"``, or a key argument of
            the other mode is given, or ``nonfinite`` is unknown; TRL reward functions' own argument errors
            (:class:`~torchrl_trl_interop.TRLRewardFuncWrapper`), named after this call. At the
            first reset or step, with ``only_done=True``, if a transform after this one sets
            done entries.

    Examples:
        >>> from tensordict import TensorDict
        >>> from torchrl.envs.llm import ChatEnv
        >>> from torchrl.modules.llm.policies import ChatHistory
        >>> from torchrl_trl_interop import messages_to_history
        >>> def says_four(completions, **kwargs):
        ...     return [float("4" in c[-1]["content"]) for c in completions]
        >>> env = ChatEnv(batch_size=(2,), input_mode="history").append_transform(
        ...     RewardTransform(says_four))
        >>> _ = env.reset(TensorDict({"query": ["2+2?", "2+3?"]}, batch_size=[2]))
        >>> chats = [[{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}],
        ...          [{"role": "user", "content": "2+3?"}, {"role": "assistant", "content": "6"}]]
        >>> full = ChatHistory(full=messages_to_history(chats), batch_size=[2])
        >>> action = TensorDict({"history": full}, batch_size=[2])  # what the policy writes
        >>> env.step(action)["next", "reward"]
        tensor([[[1.]],
        <BLANKLINE>
                [[0.]]])
        >>> env.transform.module
        TRLRewardFuncWrapper(
            reward_funcs=['says_four'],
            weights=[1.0],
            input_mode='history',
            in_keys=[('history', 'full')],
            out_keys=['reward'])
    """

    @boundary("RewardTransform")
    def __init__(
        self,
        module: TensorDictModuleBase | Callable | Sequence[Callable],
        *,
        input_mode: str | None = None,
        history_key: NestedKey | None = HISTORY_KEY,
        reward_key: NestedKey = REWARD_KEY,
        module_reward_key: NestedKey | None = None,
        completion_roles: Sequence[str] = ("assistant",),
        only_done: bool = False,
        done_key: NestedKey = DONE_KEY,
        accumulate: bool = False,
        # what TRL reward functions are given (a module is configured on its own)
        weights: Sequence[float] | None = None,
        prompt_key: NestedKey | None = None,
        completion_key: NestedKey | None = None,
        completion_ids_key: NestedKey | None = None,
        kwargs_keys: Mapping[str, NestedKey] | None = None,
        nonfinite: str = "raise",
    ) -> None:
        check_nonfinite(nonfinite)
        if isinstance(module, TensorDictModuleBase):
            passed = locals()
            given = sorted(arg for arg in _FUNC_ARGS if passed[arg] is not None)
            if given:
                raise TypeError(
                    f"got {given}, which RewardTransform does not take with a TensorDict "
                    "module (they configure TRL reward functions); configure the module "
                    "itself instead."
                )
            input_mode = resolve_input_mode(
                RewardTransform.__init__, locals(), modes=CHAT_MODES, default="history"
            )
        elif isinstance(module, torch.nn.Module) or not (
            callable(module) or isinstance(module, (list, tuple, str))  # str: a model id, refused
        ):
            raise TypeError(
                f"module is a {type(module).__name__}; expected TRL reward functions "
                "f(prompts, completions, completion_ids, **kwargs) or a TensorDict module "
                "writing a reward (TRLRewardFuncWrapper, HFRewardModelWrapper: wrap a reward "
                "model with it)."
            )
        else:  # the wrapper's errors, built or run, name this call
            module = TRLRewardFuncWrapper(
                module,
                input_mode=input_mode,
                history_key=HISTORY_KEY if history_key is None else history_key,
                prompt_key=prompt_key,
                completion_key=completion_key,
                completion_ids_key=completion_ids_key,
                kwargs_keys=kwargs_keys,
                weights=weights,
                completion_roles=completion_roles,
            )
            input_mode = module.input_mode
        self.input_mode = input_mode
        self.module_reward_key = (
            _module_reward_key(module)
            if module_reward_key is None
            else as_nested_key(module_reward_key, "module_reward_key")
        )
        self.reward_key = as_nested_key(reward_key, "reward_key")
        self.history_key = (
            None
            if history_key is None or input_mode == "text"
            else as_nested_key(history_key, "history_key")
        )
        self.completion_roles = as_names(completion_roles, "completion_roles")
        self.only_done = check_bool(only_done, "only_done")
        self.done_key = as_nested_key(done_key, "done_key")
        self.accumulate = check_bool(accumulate, "accumulate")
        self.nonfinite = nonfinite
        module_in_keys = [as_nested_key(k) for k in getattr(module, "in_keys", [])]
        super().__init__(in_keys=module_in_keys, out_keys=[self.reward_key])
        self.module = module
        # the call its step errors name: this class, or the public call that built it
        self._built_by = public_call("RewardTransform")
        self._order_checked = 0  # how many transforms the environment had when last checked

    def _call(self, next_tensordict: TensorDictBase) -> TensorDictBase:
        return next_tensordict  # rewards are written at step time, from the step's input

    def _reset(
        self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase
    ) -> TensorDictBase:
        with speaking_for(self._built_by):
            self._check_done_is_final()
        return tensordict_reset

    def _check_done_is_final(self) -> None:
        """With ``only_done``, refuses to run before a transform that sets done entries.

        TorchRL runs transforms in order: before such a transform (``StepCounter`` with
        ``max_steps``), ``done`` is not final when this transform reads it, and every step would
        score 0.0. A later transform sets done entries when it adds done entries to the
        environment's specs (as ``StepCounter`` adds ``truncated``) or names one in its
        ``out_keys``. Checked again whenever the environment's transforms change.
        """
        env = getattr(self, "container", None)  # None: not in an environment (yet)
        if not self.only_done or not isinstance(env, TransformedEnv):
            return
        transforms = flat_transforms(env.transform)
        if len(transforms) == self._order_checked:
            return
        position = next((i for i, t in enumerate(transforms) if t is self), None)
        later = [] if position is None else transforms[position + 1 :]
        if later:
            final = set(env.full_done_spec.keys(True, True))
            added = sorted(map(str, final - set(self.parent.full_done_spec.keys(True, True))))
            named = {as_nested_key(k) for t in later for k in (getattr(t, "out_keys", None) or [])}
            written = sorted(map(str, final & named))
            if added or written:
                names = [type(t).__name__ for t in later]
                raise ValueError(
                    f"{self._built_by}(only_done=True) runs before {names} in the environment's "
                    f"transforms, which set the done entries {added or written}. TorchRL runs "
                    "transforms in order, so done is not final when the reward is computed and "
                    "every step would score 0.0. Append the reward transform after the step "
                    "limit (env.append_transform(StepCounter(...)) first, then this one)."
                )
        self._order_checked = len(transforms)

    def _scored_rows(
        self, tensordict: TensorDictBase, next_tensordict: TensorDictBase
    ) -> torch.Tensor:
        n = tensordict.batch_size.numel()
        if self.history_key is None:
            scored = torch.ones(n, dtype=torch.bool)
        else:
            flat = tensordict if tensordict.ndim == 1 else tensordict.reshape(-1)
            with set_list_to_stack(True):
                history = flat.get(self.history_key, None)
                if history is None:
                    raise KeyError(
                        f"no conversation at history_key={self.history_key!r} in the step's "
                        f"input (keys: {keys_present(tensordict)}). Pass history_key=... (or "
                        "None to score every row)."
                    )
                if history.ndim == 2:  # [B, T]: read from the payloads, any layout
                    roles = history_fields(history)[0]
                else:
                    roles = history.role
                    roles = roles.tolist() if hasattr(roles, "tolist") else list(roles)
            last = [[r for r in row if r != PLACEHOLDER_ROLE][-1:] for row in roles]
            roles_scored = [bool(r) and r[0] in self.completion_roles for r in last]
            scored = torch.tensor(roles_scored, dtype=torch.bool)
        if self.only_done:
            scored &= next_tensordict.get(self.done_key).reshape(n, -1).any(-1).cpu()
        return scored

    def _selected(self, tensordict: TensorDictBase, rows: torch.Tensor) -> TensorDictBase:
        """What the module reads of the rows to score, in a new tensordict (its writes stay
        there). For a :class:`TRLRewardFuncWrapper` scoring every row (it reads its ``in_keys``
        by key), the entries holding them whole: selecting ``("history", "full")`` rebuilds the
        ``ChatHistory`` row by row."""
        missing = [k for k in self.in_keys if k not in tensordict.keys(True)]
        if missing:
            keys = keys_present(tensordict)
            message = f"the reward module reads {missing}, missing from the step's input (keys: "
            raise KeyError(f"{message}{keys}).")
        flat = tensordict.reshape(-1) if tensordict.ndim != 1 else tensordict
        if not bool(rows.all()):
            return flat.select(*self.in_keys)[rows.nonzero().squeeze(-1)]  # index what is read
        roots = {key_parts(k)[0] for k in self.in_keys}
        written = {key_parts(k)[0] for k in self.module.out_keys}
        if isinstance(self.module, TRLRewardFuncWrapper) and not roots & written:
            return flat.select(*roots)
        return flat.select(*self.in_keys)

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        # this transform's errors name the call that built it; the module's, the module
        with speaking_for(self._built_by):
            self._check_done_is_final()
            rows = self._scored_rows(tensordict, next_tensordict)
            selected = self._selected(tensordict, rows) if rows.any() else None
        if selected is not None:
            with torch.no_grad(), set_list_to_stack(True):
                out = self.module(selected)
            out = out if isinstance(out, TensorDictBase) else selected
        with speaking_for(self._built_by):
            shape, n = next_tensordict.batch_size, int(rows.sum())
            reward = torch.zeros(shape.numel())
            if selected is not None:
                written = out.get(self.module_reward_key, None)
                if not isinstance(written, torch.Tensor) or written.numel() != n:
                    raise ValueError(
                        f"the module wrote {type(written).__name__} at "
                        f"{self.module_reward_key!r}; expected one reward per scored row "
                        f"({n}). Pass module_reward_key=... naming its output."
                    )
                scores = written.detach().reshape(-1).float().cpu()
                if n == reward.numel():  # every row scored: its reward is the module's
                    reward = scores.clone()
                else:
                    reward[rows] = scores
                self._check_finite(reward)
            existing = next_tensordict.get(self.reward_key, None)
            target = existing.shape if existing is not None else (*shape, 1, 1)  # the spec's
            reward = reward.reshape(target).to(next_tensordict.device or "cpu")
            if existing is not None and not self.accumulate:
                raise ValueError(
                    f"the step already holds a reward at {self.reward_key!r} (written by the "
                    "environment or an earlier transform). Pass accumulate=True to add this "
                    "one to it, or reward_key=... to write it elsewhere."
                )
        if existing is not None:
            reward = existing + reward.to(existing.dtype)
        next_tensordict.set(self.reward_key, reward)
        return next_tensordict

    def _check_finite(self, reward: torch.Tensor) -> None:
        """Applies ``nonfinite`` to the step's rewards (``[N]``, on the CPU)."""
        if self.nonfinite == "ignore":
            return
        bad = ~torch.isfinite(reward)
        if not bool(bad.any()):
            return
        rows = bad.nonzero().flatten().tolist()
        message = (
            f"the reward of {len(rows)} of {reward.numel()} row(s) is NaN or infinite (rows "
            f"{rows[:8]}): a TRL reward function returning None for every function writes NaN. "
            "MCAdvantage would spread it over the row's group and GRPOLoss would be NaN. Return "
            "a float for every row, or pass nonfinite='warn' or 'ignore' (and leave such rows "
            "out before the advantage)."
        )
        if self.nonfinite == "raise":
            raise ValueError(message)
        warnings.warn(signed(message), RuntimeWarning, stacklevel=2)

    def transform_reward_spec(self, reward_spec: Composite) -> Composite:
        if self.reward_key not in reward_spec.keys(True):
            reward_spec[self.reward_key] = Unbounded(
                shape=(*reward_spec.shape, 1, 1), dtype=torch.float32, device=reward_spec.device
            )
        return reward_spec


#: The keyword arguments :func:`as_reward_transform` passes on: those of :class:`RewardTransform`.
_KEYWORDS = tuple(
    name
    for name, param in inspect.signature(RewardTransform.__init__).parameters.items()
    if param.kind is param.KEYWORD_ONLY
)


@boundary("as_reward_transform")
def as_reward_transform(
    module: TensorDictModuleBase | Callable | Sequence[Callable], **kwargs: Any
) -> RewardTransform:
    """Deprecated (removed in 0.3.0): use :class:`RewardTransform` (``RewardTransform(module,
    **kwargs)``).

    The same call spelled as a function, kept for the code written with it: it warns with a
    :class:`DeprecationWarning`, and its errors name ``as_reward_transform``.

    Args:
        module (TRL reward function(s) or TensorDictModuleBase): as :class:`RewardTransform`.

    Keyword Args:
        **kwargs: the keyword arguments of :class:`RewardTransform` (``input_mode``,
            ``weights``, ``only_done``, ...).

    Returns:
        a :class:`RewardTransform` to append to the environment.

    Raises:
        TypeError: if a keyword argument is not one of :class:`RewardTransform`'s (the message
            lists them), and as :class:`RewardTransform`.
        ValueError: as :class:`RewardTransform`.

    Examples:
        >>> import warnings
        >>> from trl.rewards import think_format_reward
        >>> warnings.simplefilter("ignore", DeprecationWarning)
        >>> t = as_reward_transform(think_format_reward, only_done=True)
        >>> type(t).__name__, t.module.reward_func_names
        ('RewardTransform', ['think_format_reward'])
        >>> as_reward_transform(think_format_reward, only_dne=True)
        Traceback (most recent call last):
        ...
        TypeError: as_reward_transform() got an unexpected keyword argument 'only_dne' (did you mean 'only_done'?). It takes: ['accumulate', 'completion_ids_key', 'completion_key', 'completion_roles', 'done_key', 'history_key', 'input_mode', 'kwargs_keys', 'module_reward_key', 'nonfinite', 'only_done', 'prompt_key', 'reward_key', 'weights'].
    """
    # the caller's line, past boundary's wrapper
    warn_deprecated("torchrl_trl_interop.as_reward_transform", stacklevel=3)
    check_keywords(kwargs, _KEYWORDS)
    return RewardTransform(module, **kwargs)
