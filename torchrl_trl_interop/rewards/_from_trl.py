"""TRL reward functions as a TorchRL module: :class:`TRLRewardFuncWrapper`.

It reads rollouts from a TensorDict (History or text), calls TRL reward functions (sync or
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
from typing import Any

import torch
from tensordict import TensorDictBase, set_list_to_stack
from tensordict.nn import TensorDictModuleBase
from tensordict.utils import NestedKey

from .._checks import as_mapping, as_names, check_real, check_tensordict, module_repr
from .._conversation import split_prompt_completion
from .._keys import HISTORY_KEY, as_key, as_optional_key, public_key, to_python
from ..data._columns import row_values

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

    Input, per rollout:

    * **History mode** (default): the full conversation at ``history_key`` is split into
      ``prompts`` (every turn before the trailing ``completion_roles`` turns) and ``completions``
      (those turns), both message lists: TRL's conversational format.
    * **Text mode** (``prompt_key`` and ``completion_key``): strings, TRL's standard format.

    ``completion_ids`` is read from ``completion_ids_key`` (e.g. ``("tokens", "response")``;
    ragged rows give their exact ids, padded tensors are passed as stored), else ``None``.
    ``kwargs_keys`` maps extra keyword arguments to keys (``{"answer": "answer"}``), as TRL
    passes dataset columns. Async functions run concurrently (in a helper thread if an event
    loop is already running).

    Args:
        reward_funcs (callable or list of callables): TRL reward functions, e.g.
            ``trl.rewards.think_format_reward`` or :func:`as_trl_reward_func` outputs.

    Keyword Args:
        history_key (NestedKey, optional): the full conversations. Defaults to
            ``("history", "full")``.
        prompt_key (NestedKey, optional): prompt strings (text mode). Defaults to ``None``.
        completion_key (NestedKey, optional): completion strings (text mode). Defaults to
            ``None``.
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
            non-finite weight, only one of
            ``prompt_key``/``completion_key`` is given, a non-default ``history_key`` is
            combined with them, ``history_key=None`` is given without them, ``kwargs_keys``
            uses a reserved name (``prompts``, ``completions``, ``completion_ids``), or two
            inputs share a key.

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
            in_keys=[('history', 'full')],
            out_keys=['reward'])
    """

    def __init__(
        self,
        reward_funcs: Callable | Sequence[Callable],
        *,
        history_key: NestedKey | None = HISTORY_KEY,
        prompt_key: NestedKey | None = None,
        completion_key: NestedKey | None = None,
        completion_ids_key: NestedKey | None = None,
        kwargs_keys: Mapping[str, NestedKey] | None = None,
        reward_key: NestedKey = "reward",
        reward_per_func_key: NestedKey | None = None,
        weights: Sequence[float] | None = None,
        completion_roles: Sequence[str] = ("assistant",),
    ) -> None:
        funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
        if not funcs:
            raise ValueError("TRLRewardFuncWrapper: reward_funcs is empty; pass at least one.")
        for i, func in enumerate(funcs):
            if isinstance(func, str):
                raise TypeError(
                    f"TRLRewardFuncWrapper: reward_funcs[{i}] is the string {func!r} (a model id). "
                    "Load the reward model offline and wrap it with HFRewardModelWrapper instead."
                )
            if isinstance(func, torch.nn.Module) or not callable(func):
                raise TypeError(
                    f"TRLRewardFuncWrapper: reward_funcs[{i}] is a {type(func).__name__}; expected "
                    "a TRL reward function f(prompts, completions, completion_ids, **kwargs). "
                    "Wrap a reward model with HFRewardModelWrapper (a TensorDict module) instead."
                )
        if weights is None:
            weights = [1.0] * len(funcs)
        if isinstance(weights, (str, bytes)) or not isinstance(weights, (Sequence, torch.Tensor)):
            raise TypeError(
                "TRLRewardFuncWrapper: weights must be a list of floats (one per reward function), "
                f"got {type(weights).__name__}."
            )
        weights = [
            check_real(w, f"weights[{i}]", "TRLRewardFuncWrapper") for i, w in enumerate(weights)
        ]
        if len(weights) != len(funcs):
            raise ValueError(
                f"TRLRewardFuncWrapper: got {len(weights)} weights for {len(funcs)} reward "
                "functions; pass one weight per function (as GRPOConfig.reward_weights)."
            )
        if (prompt_key is None) != (completion_key is None):
            raise ValueError(
                "TRLRewardFuncWrapper: text mode needs both prompt_key and completion_key (got "
                f"prompt_key={prompt_key!r}, completion_key={completion_key!r})."
            )
        text_mode = prompt_key is not None
        if text_mode:
            if history_key is not None and as_key(history_key, "history_key") != HISTORY_KEY:
                raise ValueError(
                    f"TRLRewardFuncWrapper: history_key={history_key!r} and prompt_key/"
                    "completion_key select two different inputs; pass only one of them."
                )
            history_key = None
            prompt_key = as_key(prompt_key, "prompt_key")
            completion_key = as_key(completion_key, "completion_key")
            in_keys = [prompt_key, completion_key]
        else:
            if history_key is None:
                raise ValueError(
                    "TRLRewardFuncWrapper: history_key=None needs prompt_key= and "
                    "completion_key= (text mode); otherwise there is no input to read."
                )
            history_key = as_key(history_key, "history_key")
            in_keys = [history_key]
        completion_ids_key = as_optional_key(completion_ids_key, "completion_ids_key")
        if completion_ids_key is not None:
            in_keys.append(completion_ids_key)
        kwargs_keys = {
            str(name): as_key(key, f"kwargs_keys[{name!r}]")
            for name, key in as_mapping(
                kwargs_keys, "kwargs_keys", "TRLRewardFuncWrapper", "{kwarg name: key}"
            ).items()
        }
        reserved = {"prompts", "completions", "completion_ids"} & set(kwargs_keys)
        if reserved:
            raise ValueError(
                f"TRLRewardFuncWrapper: kwargs_keys uses the reserved name(s) {sorted(reserved)}; "
                "they are filled from the History/text keys."
            )
        in_keys.extend(kwargs_keys.values())
        duplicates = sorted({repr(public_key(k)) for k in in_keys if in_keys.count(k) > 1})
        if duplicates:
            raise ValueError(
                f"TRLRewardFuncWrapper: the key(s) {duplicates} are used for two inputs; give "
                "each input its own key."
            )
        reward_key = as_key(reward_key, "reward_key")
        reward_per_func_key = as_optional_key(reward_per_func_key, "reward_per_func_key")
        out_keys = [k for k in (reward_key, reward_per_func_key) if k is not None]

        super().__init__()
        self.reward_funcs = funcs
        self.reward_func_names = [_callable_name(f) for f in funcs]
        self.weights = weights
        self.completion_roles = as_names(
            completion_roles, "completion_roles", "TRLRewardFuncWrapper"
        )
        self._text_mode = text_mode
        self._history_key = history_key
        self._prompt_key = prompt_key
        self._completion_key = completion_key
        self._completion_ids_key = completion_ids_key
        self._kwargs_keys = kwargs_keys
        self._reward_key = reward_key
        self._reward_per_func_key = reward_per_func_key
        self.in_keys = [public_key(k) for k in in_keys]
        self.out_keys = [public_key(k) for k in out_keys]

    def __repr__(self) -> str:
        return module_repr(
            self, [f"reward_funcs={self.reward_func_names}", f"weights={self.weights}"]
        )

    def _read(self, td: TensorDictBase) -> tuple[list, list, list | None, dict[str, list]]:
        owner = type(self).__name__
        if self._text_mode:
            prompts = row_values(td, self._prompt_key, "prompt_key", owner)
            completions = row_values(td, self._completion_key, "completion_key", owner)
        else:
            conversations = row_values(td, self._history_key, "history_key", owner)
            prompts, completions = [], []
            for i, conversation in enumerate(conversations):
                try:
                    prompt, completion = split_prompt_completion(
                        conversation, completion_roles=self.completion_roles
                    )
                except ValueError as err:
                    raise ValueError(f"{owner}: rollout {i} (flattened): {err}") from err
                prompts.append(prompt)
                completions.append(completion)
        completion_ids = (
            None
            if self._completion_ids_key is None
            else [
                to_python(v)
                for v in row_values(td, self._completion_ids_key, "completion_ids_key", owner)
            ]
        )
        kwargs = {
            name: [to_python(v) for v in row_values(td, key, f"kwargs_keys[{name!r}]", owner)]
            for name, key in self._kwargs_keys.items()
        }
        return prompts, completions, completion_ids, kwargs

    def _check_output(self, index: int, output: Any, n: int) -> list[float]:
        name = self.reward_func_names[index]
        if not isinstance(output, (list, tuple)) and not isinstance(output, torch.Tensor):
            raise TypeError(
                f"{type(self).__name__}: reward function {name!r} returned a "
                f"{type(output).__name__}; expected a list with one float (or None) per completion."
            )
        if isinstance(output, torch.Tensor) and output.ndim != 1:
            raise ValueError(
                f"{type(self).__name__}: reward function {name!r} returned a tensor of shape "
                f"{list(output.shape)}; expected one float per completion, shape [{n}]."
            )
        output = output.tolist() if isinstance(output, torch.Tensor) else list(output)
        if len(output) != n:
            raise ValueError(
                f"{type(self).__name__}: reward function {name!r} returned {len(output)} rewards "
                f"but {n} were expected (one per completion)."
            )
        owner = f"{type(self).__name__}: reward function {name!r}"
        rewards = [
            float("nan") if r is None else check_real(r, f"reward [{i}]", owner, finite=False)
            for i, r in enumerate(output)
        ]
        bad = [i for i, r in enumerate(rewards) if math.isinf(r)]
        if bad:
            raise ValueError(
                f"{owner} returned infinite reward(s) at {bad[:8]}; return a finite float, or "
                "None for a completion it does not score."
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
        check_tensordict(tensordict, "tensordict", type(self).__name__)
        with set_list_to_stack(True):  # reading History needs it; scoped, never global
            prompts, completions, completion_ids, kwargs = self._read(tensordict)
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
            tensordict.set(self._reward_key, reward.reshape(shape).to(device or "cpu"))
            if self._reward_per_func_key is not None:
                tensordict.set(
                    self._reward_per_func_key,
                    per_func.reshape(*shape, -1).to(device or "cpu"),
                )
        return tensordict
