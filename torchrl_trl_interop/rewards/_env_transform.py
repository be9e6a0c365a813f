"""TRL rewards inside TorchRL environments: a reward module as an environment transform.

:class:`RewardTransform` runs any reward TensorDict module of this package
(:class:`~torchrl_trl_interop.TRLRewardFuncWrapper` around TRL reward functions such as
``trl.rewards.think_format_reward``, or :class:`~torchrl_trl_interop.HFRewardModelWrapper`) each
time the policy ends an assistant turn, and writes the score as the environment's reward,
``("next", "reward")``, where collectors, ``MCAdvantage`` and losses read it.
:func:`as_reward_transform` builds one from a module or straight from TRL reward functions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from tensordict import TensorDictBase, set_list_to_stack
from tensordict.nn import TensorDictModuleBase
from tensordict.utils import NestedKey, unravel_key
from torchrl.data import Composite, Unbounded
from torchrl.envs.transforms import Transform

from .._checks import as_names, check_bool
from .._keys import as_key, public_key

__all__ = ["RewardTransform", "as_reward_transform"]

_HISTORY_KEY = ("history", "full")


def _module_reward_key(module: TensorDictModuleBase) -> NestedKey:
    """The module's single out key (e.g. ``HFRewardModelWrapper(reward_key="rm")``), else ``"reward"``."""
    out_keys = list(getattr(module, "out_keys", None) or [])
    return unravel_key(out_keys[0]) if len(out_keys) == 1 else "reward"


class RewardTransform(Transform):
    """Scores every assistant turn with a reward module and writes it as ``("next", reward_key)``.

    At each ``env.step`` the transform reads the step's input (the policy's output, where
    ``history_key`` holds the conversation ending with the turn just generated), runs ``module``
    on the rows to score, without gradients, and writes the reward to the step's output. Its
    shape is that of a reward already there, else ``[*batch, 1, 1]`` as torchrl's LLM reward
    parsers (``GSM8KRewardParser``) write it: a token and a feature dimension, so that
    ``MCAdvantage``'s advantage broadcasts over the tokens in ``GRPOLoss``. The reward spec is
    added with that shape if the environment has none. A row is scored when its last turn at ``history_key`` has one of the
    ``completion_roles`` and, with ``only_done=True``, when the step ends its episode (a sparse,
    trajectory-level reward); other rows get ``0.0``. A row the module leaves unscored (TRL
    reward functions all returning ``None``) keeps the module's ``NaN``.

    Args:
        module (TensorDictModuleBase): reads the conversation (or tokens) and writes one reward per
            row, e.g. ``TRLRewardFuncWrapper([think_format_reward])``.

    Keyword Args:
        reward_key (NestedKey, optional): the reward entry written in the step's output
            (``("next", reward_key)`` of the rollout). Defaults to ``"reward"``.
        module_reward_key (NestedKey, optional): where ``module`` writes its reward. Defaults to
            the module's only ``out_keys`` entry, else ``"reward"``.
        history_key (NestedKey or None, optional): the conversation, read to tell whether a turn
            ended with a completion role. ``None`` scores every row. Defaults to
            ``("history", "full")``, what torchrl's LLM wrappers write.
        completion_roles (sequence of str, optional): roles that end a scored turn. Defaults to
            ``("assistant",)``.
        only_done (bool, optional): score only steps that end the episode. Defaults to ``False``.
        done_key (NestedKey, optional): the done flag in the step's output. Defaults to ``"done"``.
        accumulate (bool, optional): add to a reward another transform already wrote instead of
            refusing to overwrite it. Defaults to ``False``.

    Raises:
        TypeError: if ``module`` is not a ``TensorDictModuleBase``.

    Examples:
        >>> from tensordict import TensorDict
        >>> from torchrl.envs.llm import ChatEnv
        >>> from torchrl.modules.llm.policies import ChatHistory
        >>> from torchrl_trl_interop import TRLRewardFuncWrapper
        >>> from torchrl_trl_interop import messages_to_history
        >>> def says_four(completions, **kwargs):
        ...     return [float("4" in c[-1]["content"]) for c in completions]
        >>> env = ChatEnv(batch_size=(2,), input_mode="history").append_transform(
        ...     RewardTransform(TRLRewardFuncWrapper(says_four)))
        >>> _ = env.reset(TensorDict({"query": ["2+2?", "2+3?"]}, batch_size=[2]))
        >>> chats = [[{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}],
        ...          [{"role": "user", "content": "2+3?"}, {"role": "assistant", "content": "6"}]]
        >>> full = ChatHistory(full=messages_to_history(chats), batch_size=[2])
        >>> action = TensorDict({"history": full}, batch_size=[2])  # what the policy writes
        >>> env.step(action)["next", "reward"]
        tensor([[[1.]],
        <BLANKLINE>
                [[0.]]])
    """

    def __init__(
        self,
        module: TensorDictModuleBase,
        *,
        reward_key: NestedKey = "reward",
        module_reward_key: NestedKey | None = None,
        history_key: NestedKey | None = _HISTORY_KEY,
        completion_roles: Sequence[str] = ("assistant",),
        only_done: bool = False,
        done_key: NestedKey = "done",
        accumulate: bool = False,
    ) -> None:
        if not isinstance(module, TensorDictModuleBase):
            raise TypeError(
                f"RewardTransform: module is a {type(module).__name__}; expected a TensorDict "
                "module writing a reward (TRLRewardFuncWrapper, HFRewardModelWrapper). For TRL "
                "reward functions use as_reward_transform(func)."
            )
        self.module_reward_key = (
            _module_reward_key(module)
            if module_reward_key is None
            else public_key(as_key(module_reward_key, "module_reward_key"))
        )
        self.reward_key = public_key(as_key(reward_key, "reward_key"))
        self.history_key = (
            None if history_key is None else public_key(as_key(history_key, "history_key"))
        )
        self.completion_roles = as_names(completion_roles, "completion_roles", "RewardTransform")
        self.only_done = check_bool(only_done, "only_done", "RewardTransform")
        self.done_key = public_key(as_key(done_key, "done_key"))
        self.accumulate = check_bool(accumulate, "accumulate", "RewardTransform")
        module_in_keys = [unravel_key(k) for k in getattr(module, "in_keys", [])]
        super().__init__(in_keys=module_in_keys, out_keys=[self.reward_key])
        self.module = module

    def _call(self, next_tensordict: TensorDictBase) -> TensorDictBase:
        return next_tensordict  # rewards are written at step time, from the step's input

    def _reset(
        self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase
    ) -> TensorDictBase:
        return tensordict_reset

    def _scored_rows(
        self, tensordict: TensorDictBase, next_tensordict: TensorDictBase
    ) -> torch.Tensor:
        n = tensordict.batch_size.numel()
        scored = torch.ones(n, dtype=torch.bool)
        if self.history_key is not None:
            if self.history_key not in tensordict.keys(True):
                raise KeyError(
                    f"RewardTransform: no conversation at history_key={self.history_key!r} in "
                    f"the step's input (keys: {sorted(map(str, tensordict.keys(True, True)))}). "
                    "Pass history_key=... (or None to score every row)."
                )
            flat = tensordict if tensordict.ndim == 1 else tensordict.reshape(-1)
            with set_list_to_stack(True):
                roles = flat.get(self.history_key).role
                roles = roles.tolist() if hasattr(roles, "tolist") else list(roles)
            last = [[r for r in row if r != "<none>"][-1:] for row in roles]
            scored &= torch.tensor([bool(r) and r[0] in self.completion_roles for r in last])
        if self.only_done:
            scored &= next_tensordict.get(self.done_key).reshape(n, -1).any(-1).cpu()
        return scored

    def _score(self, tensordict: TensorDictBase, rows: torch.Tensor) -> torch.Tensor:
        missing = [k for k in self.in_keys if k not in tensordict.keys(True)]
        if missing:
            raise KeyError(
                f"RewardTransform: the reward module reads {missing}, missing from the step's "
                f"input (keys: {sorted(map(str, tensordict.keys(True, True)))})."
            )
        flat = tensordict.reshape(-1) if tensordict.ndim != 1 else tensordict
        selected = flat[rows.nonzero().squeeze(-1)].select(*self.in_keys)
        with torch.no_grad(), set_list_to_stack(True):
            out = self.module(selected)
        out = out if isinstance(out, TensorDictBase) else selected
        reward = out.get(self.module_reward_key, None)
        if not isinstance(reward, torch.Tensor) or reward.numel() != int(rows.sum()):
            raise ValueError(
                f"RewardTransform: the module wrote {type(reward).__name__} at "
                f"{self.module_reward_key!r}; expected one reward per scored row "
                f"({int(rows.sum())}). Pass module_reward_key=... naming its output."
            )
        return reward.detach().reshape(-1).float().cpu()

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        shape = next_tensordict.batch_size
        rows = self._scored_rows(tensordict, next_tensordict)
        reward = torch.zeros(shape.numel())
        if rows.any():
            reward[rows] = self._score(tensordict, rows)
        existing = next_tensordict.get(self.reward_key, None)
        target = existing.shape if existing is not None else (*shape, 1, 1)  # the spec's shape
        reward = reward.reshape(target).to(next_tensordict.device or "cpu")
        if existing is not None:
            if not self.accumulate:
                raise ValueError(
                    f"RewardTransform: the step already holds a reward at {self.reward_key!r} "
                    "(written by the environment or an earlier transform). Pass accumulate=True "
                    "to add this one to it, or reward_key=... to write it elsewhere."
                )
            reward = existing + reward.to(existing.dtype)
        next_tensordict.set(self.reward_key, reward)
        return next_tensordict

    def transform_reward_spec(self, reward_spec: Composite) -> Composite:
        if self.reward_key not in reward_spec.keys(True):
            reward_spec[self.reward_key] = Unbounded(
                shape=(*reward_spec.shape, 1, 1), dtype=torch.float32, device=reward_spec.device
            )
        return reward_spec


def as_reward_transform(
    module: TensorDictModuleBase | Callable | Sequence[Callable],
    **kwargs: Any,
) -> RewardTransform:
    """Wraps a reward module, or TRL reward functions, as a :class:`RewardTransform`.

    Args:
        module (TensorDictModuleBase, callable or list of callables): a reward TensorDict module
            (``TRLRewardFuncWrapper``, ``HFRewardModelWrapper``), or TRL reward functions
            ``f(prompts, completions, completion_ids, **kwargs)``, which are wrapped in a
            :class:`~torchrl_trl_interop.TRLRewardFuncWrapper` first (History mode, on
            ``history_key``).

    Keyword Args:
        **kwargs: :class:`RewardTransform` keyword arguments; with reward functions also
            ``TRLRewardFuncWrapper`` ones (``weights``, ``kwargs_keys``, ``completion_ids_key``).

    Returns:
        a :class:`RewardTransform` to append to the environment.

    Raises:
        TypeError: if a keyword argument is not accepted (``TRLRewardFuncWrapper`` arguments
            need reward functions, not a module), or ``module`` is neither.

    Examples:
        >>> from trl.rewards import think_format_reward
        >>> t = as_reward_transform(think_format_reward, only_done=True)
        >>> t.module
        TRLRewardFuncWrapper(
            reward_funcs=['think_format_reward'],
            weights=[1.0],
            in_keys=[('history', 'full')],
            out_keys=['reward'])
    """
    own = {
        "reward_key",
        "module_reward_key",
        "history_key",
        "completion_roles",
        "only_done",
        "done_key",
        "accumulate",
    }
    transform_kwargs = {k: v for k, v in kwargs.items() if k in own}
    extra = {k: v for k, v in kwargs.items() if k not in own}
    if not isinstance(module, TensorDictModuleBase):
        from ._from_trl import TRLRewardFuncWrapper

        wrapper_kwargs = dict(extra)
        for name in ("history_key", "completion_roles"):
            if name in transform_kwargs and transform_kwargs[name] is not None:
                wrapper_kwargs[name] = transform_kwargs[name]
        module = TRLRewardFuncWrapper(module, **wrapper_kwargs)
    elif extra:
        raise TypeError(
            f"as_reward_transform: got {sorted(extra)}, which RewardTransform does not take "
            f"(it takes {sorted(own)}); configure the module itself instead."
        )
    return RewardTransform(module, **transform_kwargs)
