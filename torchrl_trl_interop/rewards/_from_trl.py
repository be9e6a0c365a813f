"""TRL reward functions as a TorchRL module: :class:`TRLRewardFuncWrapper`.

It reads rollouts from a TensorDict (``input_mode="history"`` or ``"text"``), calls TRL reward functions (sync or
``async``) with TRL's keyword convention ``f(prompts=..., completions=..., completion_ids=...,
**kwargs) -> list[float | None]``, and writes their weighted sum as GRPOTrainer computes it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDictBase, set_list_to_stack
from tensordict.nn import TensorDictModuleBase
from tensordict.utils import NestedKey

from .._checks import (
    as_mapping,
    as_names,
    boundary,
    check_real,
    check_tensordict,
    module_repr,
    public_call,
    speaking_for,
)
from .._conversation import row_values
from .._keys import (
    HISTORY_KEY,
    PROMPT_TEXT_KEY,
    RESPONSE_TEXT_KEY,
    REWARD_KEY,
    as_nested_key,
    to_python,
)
from ._input_mode import CHAT_MODES, check_distinct_keys, resolve_input_mode
from ._inputs import read_chat_texts, read_chats

__all__ = ["TRLRewardFuncWrapper"]


def _callable_name(func: Callable) -> str:
    """TRL's display name of a reward function (``trl.trainer.utils.get_callable_name``)."""
    while isinstance(func, functools.partial):
        func = func.func
    return getattr(func, "__name__", type(func).__name__)


def _is_async(func: Callable) -> bool:
    """TRL's ``is_async_callable``: async functions, partials of them, async ``__call__``."""
    while isinstance(func, functools.partial):
        func = func.func
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(type(func).__call__)


def _run_coroutines(coroutines: list) -> list:
    """Awaits ``coroutines`` concurrently, from sync code, inside or outside a running loop."""

    async def gather() -> list:
        return await asyncio.gather(*coroutines)

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(gather())
    # a loop already runs in this thread (notebook, async server): run ours in a helper thread
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, gather()).result()


def _check_reward_funcs(reward_funcs: Any) -> list[Callable]:
    """``reward_funcs`` as a non-empty list of TRL reward functions (not models, not model ids)."""
    funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    if not funcs:
        raise ValueError("reward_funcs is empty; pass at least one.")
    for i, func in enumerate(funcs):
        if isinstance(func, str):
            raise TypeError(
                f"reward_funcs[{i}] is the string {func!r} (a model id). Load the reward "
                "model offline and wrap it with HFRewardModelWrapper instead."
            )
        if isinstance(func, torch.nn.Module) or not callable(func):
            raise TypeError(
                f"reward_funcs[{i}] is a {type(func).__name__}; expected a TRL reward "
                "function f(prompts, completions, completion_ids, **kwargs). Wrap a reward "
                "model with HFRewardModelWrapper (a TensorDict module) instead."
            )
    return funcs


def _check_weights(weights: Any, n: int) -> list[float]:
    """One finite float per reward function, as ``GRPOConfig.reward_weights``; ``None``: 1.0 each."""
    if weights is None:
        return [1.0] * n
    if isinstance(weights, (str, bytes)) or not isinstance(weights, (Sequence, torch.Tensor)):
        raise TypeError(
            "weights must be a list of floats (one per reward function), got "
            f"{type(weights).__name__}."
        )
    weights = [check_real(w, f"weights[{i}]") for i, w in enumerate(weights)]
    if len(weights) != n:
        raise ValueError(
            f"got {len(weights)} weights for {n} reward functions; pass one weight per "
            "function (as GRPOConfig.reward_weights)."
        )
    return weights


@dataclass(frozen=True)
class _CallInputs:
    """Where :class:`TRLRewardFuncWrapper` reads each argument of a TRL reward call (canonical
    keys; ``None`` for the keys of the other mode, and for no ``completion_ids``)."""

    input_mode: str
    history_key: NestedKey | None
    prompt_key: NestedKey | None
    completion_key: NestedKey | None
    completion_ids_key: NestedKey | None
    kwargs_keys: dict[str, NestedKey]

    def read(
        self, td: TensorDictBase, completion_roles: Sequence[str]
    ) -> tuple[list, list, list | None, dict[str, list]]:
        """``prompts``, ``completions``, ``completion_ids`` and the extra keyword arguments."""
        if self.input_mode == "text":
            prompts, completions = read_chat_texts(td, self.prompt_key, self.completion_key)
        else:
            prompts, completions = read_chats(td, self.history_key, completion_roles)
        completion_ids = (
            None
            if self.completion_ids_key is None
            else [
                to_python(v) for v in row_values(td, self.completion_ids_key, "completion_ids_key")
            ]
        )
        kwargs = {
            name: [to_python(v) for v in row_values(td, key, f"kwargs_keys[{name!r}]")]
            for name, key in self.kwargs_keys.items()
        }
        return prompts, completions, completion_ids, kwargs


class TRLRewardFuncWrapper(TensorDictModuleBase):
    """Runs TRL reward functions on TorchRL rollouts and writes their (weighted) reward.

    A TRL reward function is ``f(prompts, completions, completion_ids, **kwargs) ->
    list[float | None]`` (sync or ``async``), as given to ``GRPOTrainer(reward_funcs=...)``. This
    module reads the rollouts of a TensorDict (any batch shape: ``[]``, ``[B]``, ``[E, G]``),
    calls every function once on the whole batch with TRL's keyword convention, and writes

    .. code-block:: text

        reward_key           float32 [*batch]      nansum_i(weight_i * reward_i); NaN where
                                                   every function returned None (as GRPOTrainer)
        reward_per_func_key  float32 [*batch, F]   each function's rewards, None -> NaN

    Input, per rollout, in one of two forms, ``input_mode`` (as ``ChatEnv`` names them):

    * ``"history"`` (default): the full conversation at ``history_key`` is split into
      ``prompts`` (every turn before the trailing ``completion_roles`` turns) and ``completions``
      (those turns), both message lists: TRL's conversational format.
    * ``"text"``: strings at ``prompt_key`` and ``completion_key`` (TorchRL's
      ``("text", "prompt")`` and ``("text", "response")`` by default): TRL's standard format.

    Code written before ``input_mode`` runs unchanged: without ``input_mode``, passing both
    ``prompt_key`` and ``completion_key`` selects text (a key argument equal to its default
    counts as not given), and a key argument of another mode than ``input_mode`` is an error.

    ``completion_ids`` is read from ``completion_ids_key`` (e.g. ``("tokens", "response")``;
    ragged rows give their exact ids, padded tensors are passed as stored), else ``None``.
    ``kwargs_keys`` maps extra keyword arguments to keys (``{"answer": "answer"}``), as TRL
    passes dataset columns. Async functions run concurrently (in a helper thread if an event
    loop is already running).

    Args:
        reward_funcs (callable or list of callables): TRL reward functions, e.g.
            ``trl.rewards.think_format_reward`` or :func:`as_trl_reward_func` outputs.

    Keyword Args:
        input_mode (str, optional): ``"history"`` or ``"text"``. Defaults to ``None``: ``"text"``
            if ``prompt_key`` and ``completion_key`` are given, else ``"history"``.
        history_key (NestedKey, optional): the full conversations (``"history"`` mode).
            Defaults to ``("history", "full")``.
        prompt_key (NestedKey, optional): prompt strings (``"text"`` mode). Defaults to
            ``None``: ``("text", "prompt")`` in ``"text"`` mode.
        completion_key (NestedKey, optional): completion strings (``"text"`` mode). Defaults
            to ``None``: ``("text", "response")`` in ``"text"`` mode.
        completion_ids_key (NestedKey, optional): completion token ids. Defaults to ``None``.
        kwargs_keys (dict, optional): ``{kwarg name: key}`` passed to every function.
        reward_key (NestedKey, optional): where the reward is written. Defaults to
            ``"reward"``.
        reward_per_func_key (NestedKey, optional): where per-function rewards are written.
            Defaults to ``None`` (not written).
        weights (list of float, optional): one weight per function, as
            ``GRPOConfig.reward_weights``. Defaults to ``1.0`` each.
        completion_roles (sequence of str, optional): roles of the completion turns in
            History mode. Defaults to ``("assistant",)``.

    Raises:
        TypeError: if a reward function is not callable, is an ``nn.Module`` or a model id
            string (wrap a reward model with ``HFRewardModelWrapper`` instead), a weight is not
            a number, or ``completion_roles`` is not a str or a list of str.
        ValueError: if ``reward_funcs`` is empty, ``weights`` has the wrong length or a
            non-finite weight, ``input_mode`` is not ``"history"`` or ``"text"``, a key
            argument of another mode than ``input_mode`` is given (without ``input_mode``: a
            non-default ``history_key`` with ``prompt_key``/``completion_key``, or only one of
            these two), ``"history"`` mode has ``history_key=None``, ``kwargs_keys`` uses a
            reserved name (``prompts``, ``completions``, ``completion_ids``), or two inputs
            share a key.

    Errors name the call the user made: this class, or the public call that built it for them
    (``RewardTransform`` given TRL reward functions).

    Examples:
        >>> from tensordict import TensorDict
        >>> from torchrl_trl_interop import messages_to_history
        >>> def brevity(completions, **kwargs):
        ...     return [-float(len(c[0]["content"])) for c in completions]
        >>> async def says_four(completions, **kwargs):  # async works too
        ...     return [1.0 if "4" in c[0]["content"] else None for c in completions]
        >>> chats = [[{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}],
        ...          [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "five"}]]
        >>> td = TensorDict({"history": {"full": messages_to_history(chats)}}, batch_size=[2])
        >>> scorer = TRLRewardFuncWrapper([brevity, says_four], weights=[1.0, 10.0])
        >>> scorer(td)["reward"]
        tensor([ 9., -4.])
        >>> scorer
        TRLRewardFuncWrapper(
            reward_funcs=['brevity', 'says_four'],
            weights=[1.0, 10.0],
            input_mode='history',
            in_keys=[('history', 'full')],
            out_keys=['reward'])

        Text rollouts, as a TorchRL policy in ``input_mode="text"`` writes them:

        >>> texts = TensorDict({"text": {"prompt": ["2+2=", "3+3="], "response": ["4", "10"]}},
        ...                    batch_size=[2])
        >>> def short(completions, **kwargs):
        ...     return [-float(len(c)) for c in completions]
        >>> TRLRewardFuncWrapper(short, input_mode="text")(texts)["reward"]
        tensor([-1., -2.])
    """

    @boundary("TRLRewardFuncWrapper")
    def __init__(
        self,
        reward_funcs: Callable | Sequence[Callable],
        *,
        input_mode: str | None = None,
        history_key: NestedKey | None = HISTORY_KEY,
        prompt_key: NestedKey | None = None,
        completion_key: NestedKey | None = None,
        completion_ids_key: NestedKey | None = None,
        kwargs_keys: Mapping[str, NestedKey] | None = None,
        reward_key: NestedKey = REWARD_KEY,
        reward_per_func_key: NestedKey | None = None,
        weights: Sequence[float] | None = None,
        completion_roles: Sequence[str] = ("assistant",),
    ) -> None:
        implied = input_mode is None
        input_mode = resolve_input_mode(  # first: it reads the arguments as passed
            TRLRewardFuncWrapper.__init__, locals(), modes=CHAT_MODES, default="history"
        )
        funcs = _check_reward_funcs(reward_funcs)
        weights = _check_weights(weights, len(funcs))
        if input_mode == "text":
            if implied and (prompt_key is None or completion_key is None):
                raise ValueError(
                    "text mode needs both prompt_key and completion_key (got "
                    f"prompt_key={prompt_key!r}, completion_key={completion_key!r}). Pass "
                    "both, or input_mode='text' to read TorchRL's ('text', 'prompt') and "
                    "('text', 'response') where a key is not given."
                )
            history_key = None
            prompt_key = as_nested_key(
                PROMPT_TEXT_KEY if prompt_key is None else prompt_key, "prompt_key"
            )
            completion_key = as_nested_key(
                RESPONSE_TEXT_KEY if completion_key is None else completion_key, "completion_key"
            )
            in_keys = [prompt_key, completion_key]
        else:
            if history_key is None:
                raise ValueError(
                    "history_key=None needs prompt_key= and completion_key= "
                    "(input_mode='text'); otherwise there is no input to read."
                )
            history_key = as_nested_key(history_key, "history_key")
            in_keys = [history_key]
        if completion_ids_key is not None:
            completion_ids_key = as_nested_key(completion_ids_key, "completion_ids_key")
            in_keys.append(completion_ids_key)
        kwargs_keys = {
            str(name): as_nested_key(key, f"kwargs_keys[{name!r}]")
            for name, key in as_mapping(kwargs_keys, "kwargs_keys", "{kwarg name: key}").items()
        }
        reserved = {"prompts", "completions", "completion_ids"} & set(kwargs_keys)
        if reserved:
            raise ValueError(
                f"kwargs_keys uses the reserved name(s) {sorted(reserved)}; they are filled "
                "from the History/text keys."
            )
        in_keys.extend(kwargs_keys.values())
        check_distinct_keys(in_keys)
        reward_key = as_nested_key(reward_key, "reward_key")
        if reward_per_func_key is not None:
            reward_per_func_key = as_nested_key(reward_per_func_key, "reward_per_func_key")
        completion_roles = as_names(completion_roles, "completion_roles")

        super().__init__()
        self.reward_funcs = funcs
        self.reward_func_names = [_callable_name(f) for f in funcs]
        self.weights = weights
        self.completion_roles = completion_roles
        self.input_mode = input_mode
        self._inputs = _CallInputs(
            input_mode, history_key, prompt_key, completion_key, completion_ids_key, kwargs_keys
        )
        # the call its errors name when it runs: this class, or the public call that built it
        # for the user (RewardTransform given TRL reward functions)
        self._built_by = public_call("TRLRewardFuncWrapper")
        self.in_keys = in_keys
        self.out_keys = [k for k in (reward_key, reward_per_func_key) if k is not None]

    def __repr__(self) -> str:
        fields = [f"reward_funcs={self.reward_func_names}", f"weights={self.weights}"]
        return module_repr(self, [*fields, f"input_mode={self.input_mode!r}"])

    def _check_output(self, index: int, output: Any, n: int) -> list[float]:
        name = self.reward_func_names[index]
        if not isinstance(output, (list, tuple)) and not isinstance(output, torch.Tensor):
            raise TypeError(
                f"reward function {name!r} returned a {type(output).__name__}; expected a "
                "list with one float (or None) per completion."
            )
        if isinstance(output, torch.Tensor) and output.ndim != 1:
            raise ValueError(
                f"reward function {name!r} returned a tensor of shape {list(output.shape)}; "
                f"expected one float per completion, shape [{n}]."
            )
        output = output.tolist() if isinstance(output, torch.Tensor) else list(output)
        if len(output) != n:
            raise ValueError(
                f"reward function {name!r} returned {len(output)} rewards but {n} were "
                "expected (one per completion)."
            )
        rewards = [
            float("nan")
            if r is None
            else check_real(r, f"reward function {name!r}: reward [{i}]", finite=False)
            for i, r in enumerate(output)
        ]
        bad = [i for i, r in enumerate(rewards) if math.isinf(r)]
        if bad:
            raise ValueError(
                f"reward function {name!r} returned infinite reward(s) at {bad[:8]}; return a "
                "finite float, or None for a completion it does not score."
            )
        return rewards

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Scores every rollout of ``tensordict`` and writes the reward(s).

        Raises:
            KeyError: if an input key is missing (the keys present are listed).
            TypeError: if an input has an unreadable type, or a function returns no list or
                a reward that is not a number or ``None`` (a str, a nested list...); the
                function is named.
            ValueError: if a conversation has no completion turn, an input's shape does not
                match the batch, or a function returns the wrong number of rewards, a tensor
                that is not 1-D, or an infinite reward.
        """
        with speaking_for(self._built_by):  # errors name the call that built this module
            return self._score(tensordict)

    def _score(self, tensordict: TensorDictBase) -> TensorDictBase:
        check_tensordict(tensordict, "tensordict")
        with set_list_to_stack(True):  # reading History needs it; scoped, never global
            prompts, completions, completion_ids, kwargs = self._inputs.read(
                tensordict, self.completion_roles
            )
        n = len(prompts)
        call = {"prompts": prompts, "completions": completions, "completion_ids": completion_ids}
        outputs: list[list[float] | None] = [None] * len(self.reward_funcs)
        pending = []
        for i, func in enumerate(self.reward_funcs):
            if _is_async(func):
                pending.append((i, func(**call, **kwargs)))
            else:
                outputs[i] = self._check_output(i, func(**call, **kwargs), n)
        if pending:
            results = _run_coroutines([coroutine for _, coroutine in pending])
            for (i, _), output in zip(pending, results):
                outputs[i] = self._check_output(i, output, n)

        with torch.inference_mode(False):  # normal tensors even inside the caller's inference
            device = tensordict.device
            per_func = (
                torch.tensor(outputs, dtype=torch.float32).reshape(len(outputs), n).T
            )  # [N, F]
            weights = torch.tensor(self.weights, dtype=torch.float32)
            reward = (per_func * weights).nansum(-1)
            reward[per_func.isnan().all(-1)] = float("nan")  # unscorable, as GRPOTrainer marks it
            shape = tensordict.batch_size
            reward_key, *per_func_key = self.out_keys  # reward_per_func_key, where written
            tensordict.set(reward_key, reward.reshape(shape).to(device or "cpu"))
            if per_func_key:
                tensordict.set(per_func_key[0], per_func.reshape(*shape, -1).to(device or "cpu"))
        return tensordict
