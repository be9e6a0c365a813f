"""Reward-function bridges, both ways, between TorchRL reward modules and TRL reward functions.

* TorchRL -> TRL: :func:`as_trl_reward_func` turns a :class:`~tensordict.nn.TensorDictModuleBase`
  that writes a reward (e.g. :class:`~torchrl_trl_interop.HFRewardModelWrapper`) into a
  ``GRPOTrainer`` / ``RLOOTrainer`` ``reward_funcs`` callable.
* TRL -> TorchRL: :class:`TRLRewardFuncWrapper` runs TRL reward functions (sync or async) on a
  TensorDict of ``History`` or text rollouts and writes the reward, as a TorchRL module.

Both follow TRL's calling convention exactly: ``f(prompts=..., completions=...,
completion_ids=..., **kwargs) -> list[float | None]``, ``None`` meaning "not scored".
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from tensordict import NonTensorData, NonTensorStack, TensorDictBase, set_list_to_stack
from tensordict.nn import TensorDictModuleBase
from tensordict.utils import NestedKey

from ._utils import format_keys, normalize_key
from .conversation import (
    _rows_to_tensordict,
    history_to_messages,
    is_message_list,
    split_prompt_completion,
)

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedTokenizerBase

__all__ = ["TRLRewardFuncWrapper", "as_trl_reward_func"]

_DEFAULT_HISTORY_KEY = ("history", "full")
_DEFAULT_MASK_KEY = ("masks", "all_attention_mask")


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


def _keys_present(td: TensorDictBase) -> str:
    return format_keys(td.keys(True, True))


# ---------------------------------------------------------------------------------------------
# TorchRL -> TRL
# ---------------------------------------------------------------------------------------------


class _ModuleRewardFunc:
    """The callable :func:`as_trl_reward_func` returns (a plain object, not an ``nn.Module``:
    TRL would take an ``nn.Module`` for a Hugging Face reward model and call it on token ids)."""

    def __init__(
        self,
        module: TensorDictModuleBase,
        *,
        history_key: NestedKey | None,
        text_key: NestedKey | None,
        token_key: NestedKey | None,
        attention_mask_key: NestedKey | None,
        completion_ids_key: NestedKey | None,
        kwargs_keys: Mapping[str, NestedKey],
        reward_key: NestedKey,
        processing_class: PreTrainedTokenizerBase | None,
        max_batch_size: int | None,
        device: torch.device | None,
        name: str,
    ) -> None:
        self.module = module
        self.history_key = history_key
        self.text_key = text_key
        self.token_key = token_key
        self.attention_mask_key = attention_mask_key
        self.completion_ids_key = completion_ids_key
        self.kwargs_keys = dict(kwargs_keys)
        self.reward_key = reward_key
        self.processing_class = processing_class
        self.max_batch_size = max_batch_size
        self.device = device
        self.__name__ = name
        self.__qualname__ = name

    def __repr__(self) -> str:
        return (
            f"as_trl_reward_func({type(self.module).__name__}, name={self.__name__!r}, "
            f"history_key={self.history_key!r}, text_key={self.text_key!r}, "
            f"token_key={self.token_key!r}, reward_key={self.reward_key!r})"
        )

    # -- building the input tensordict ---------------------------------------------------------

    def _render(self, prompt: Any, completion: Any, conversational: bool) -> str:
        if not conversational:
            return prompt + completion  # as TRL joins standard text for reward models
        return self.processing_class.apply_chat_template(prompt + completion, tokenize=False)

    def _columns(
        self,
        prompts: list,
        completions: list,
        completion_ids: list | None,
        kwargs: dict[str, Any],
    ) -> list[tuple[NestedKey, list]]:
        n = len(prompts)
        conversational = is_message_list(prompts[0]) or is_message_list(completions[0])
        columns: list[tuple[NestedKey, list]] = []
        if conversational and self.history_key is not None:
            columns.append((self.history_key, [p + c for p, c in zip(prompts, completions)]))
        if self.text_key is not None or self.token_key is not None:
            if conversational and self.processing_class is None:
                raise ValueError(
                    f"{self.__name__}: conversational prompts/completions need processing_class= "
                    f"to be rendered as text for text_key={self.text_key!r} / "
                    f"token_key={self.token_key!r}; pass the tokenizer whose chat template the "
                    "module expects, or read History with history_key=..."
                )
            texts = [self._render(p, c, conversational) for p, c in zip(prompts, completions)]
            if self.text_key is not None:
                columns.append((self.text_key, texts))
            if self.token_key is not None:
                # as TRL tokenizes reward-model input: rendered text, no extra special tokens
                ids = self.processing_class(texts, add_special_tokens=False)["input_ids"]
                columns.append((self.token_key, [list(i) for i in ids]))
                if self.attention_mask_key is not None:
                    columns.append((self.attention_mask_key, [[True] * len(i) for i in ids]))
        if self.completion_ids_key is not None:
            if completion_ids is None:
                raise ValueError(
                    f"{self.__name__}: completion_ids_key={self.completion_ids_key!r} is set but "
                    "the caller passed completion_ids=None."
                )
            columns.append((self.completion_ids_key, [list(ids) for ids in completion_ids]))
        for column, key in self.kwargs_keys.items():
            if column not in kwargs:
                raise KeyError(
                    f"{self.__name__}: kwargs_keys names the column {column!r}, which the trainer "
                    f"did not pass (reward kwargs: {format_keys(kwargs)}). Add the column to the "
                    "dataset or drop it from kwargs_keys."
                )
            values = kwargs[column]
            if not isinstance(values, (list, tuple)) or len(values) != n:
                raise ValueError(
                    f"{self.__name__}: reward kwarg {column!r} should be a list with one value "
                    f"per completion ({n}), got {type(values).__name__}."
                )
            columns.append((key, list(values)))
        if not columns:
            raise ValueError(
                f"{self.__name__}: standard-format (string) prompts and completions cannot be "
                "written as History; pass text_key=... (the key the module reads text from) or "
                "token_key=... with processing_class=..."
            )
        return columns

    def _score(self, columns: list[tuple[NestedKey, list]], start: int, stop: int) -> list[float]:
        names = [f"#{i}" for i in range(len(columns))]
        rows = [
            {name: values[i] for name, (_, values) in zip(names, columns)}
            for i in range(start, stop)
        ]
        rename = {name: key for name, (key, _) in zip(names, columns)}
        with set_list_to_stack(True):
            td, _ = _rows_to_tensordict(rows, rename, None)
            if self.device is not None:
                td = td.to(self.device)
            with torch.no_grad():
                out = self.module(td)
        out = out if isinstance(out, TensorDictBase) else td
        if self.reward_key not in out.keys(True):
            raise KeyError(
                f"{self.__name__}: the module wrote no reward at reward_key={self.reward_key!r} "
                f"(keys after the call: {_keys_present(out)}). Pass reward_key=... naming the "
                "module's output."
            )
        reward = out.get(self.reward_key)
        if not isinstance(reward, torch.Tensor) or reward.numel() != stop - start:
            raise ValueError(
                f"{self.__name__}: the module's reward at {self.reward_key!r} is "
                f"{getattr(reward, 'shape', type(reward).__name__)}; expected one value per "
                f"completion ({stop - start})."
            )
        return reward.detach().reshape(-1).float().cpu().tolist()

    def __call__(
        self,
        prompts: list,
        completions: list,
        completion_ids: list | None = None,
        **kwargs: Any,
    ) -> list[float]:
        if len(prompts) != len(completions):
            raise ValueError(
                f"{self.__name__}: got {len(prompts)} prompts but {len(completions)} completions; "
                "TRL passes one prompt per completion."
            )
        if not prompts:
            return []
        columns = self._columns(list(prompts), list(completions), completion_ids, kwargs)
        n = len(prompts)
        step = self.max_batch_size or n
        rewards: list[float] = []
        for start in range(0, n, step):
            rewards.extend(self._score(columns, start, min(start + step, n)))
        return rewards


def _default_name(module: Any) -> str:
    model = getattr(module, "model", None)
    path = getattr(getattr(model, "config", None), "_name_or_path", "") or ""
    if path:
        return path.rstrip("/").split("/")[-1]  # TRL names reward models by their model id
    return type(module).__name__


def _default_reward_key(module: Any) -> NestedKey:
    """The module's single out key (e.g. a wrapper built with ``reward_key="rm_reward"``)."""
    out_keys = list(getattr(module, "out_keys", None) or [])
    return out_keys[0] if len(out_keys) == 1 else "reward"


def as_trl_reward_func(
    module: TensorDictModuleBase,
    *,
    history_key: NestedKey | None = _DEFAULT_HISTORY_KEY,
    text_key: NestedKey | None = None,
    token_key: NestedKey | None = None,
    attention_mask_key: NestedKey | None = _DEFAULT_MASK_KEY,
    completion_ids_key: NestedKey | None = None,
    kwargs_keys: Mapping[str, NestedKey] | None = None,
    reward_key: NestedKey | None = None,
    processing_class: PreTrainedTokenizerBase | None = None,
    max_batch_size: int | None = None,
    device: torch.device | str | None = None,
    name: str | None = None,
) -> Callable[..., list[float]]:
    """Turns a TorchRL reward module into a TRL reward function (``GRPOTrainer(reward_funcs=...)``).

    The returned callable has TRL's signature ``(prompts, completions, completion_ids, **kwargs)
    -> list[float]``. On each call it builds a ``[N]`` TensorDict (``N`` = number of
    completions) holding, per completion:

    ======================== ===============================================================
    key                      value
    ======================== ===============================================================
    ``history_key``          ``History`` of ``prompt + completion`` (conversational input)
    ``text_key``             ``prompt + completion`` as text: joined (standard) or rendered
                             with ``processing_class``'s chat template (conversational)
    ``token_key``            that text tokenized by ``processing_class`` (no special tokens
                             added, as TRL tokenizes reward-model input), ragged, and an
                             all-``True`` mask at ``attention_mask_key``
    ``completion_ids_key``   the completion token ids TRL passed
    ``kwargs_keys``          extra dataset columns TRL passes as kwargs, ``{column: key}``
    ======================== ===============================================================

    runs ``module`` on it under :func:`torch.no_grad` (in chunks of ``max_batch_size`` rows) and
    returns the reward at ``reward_key`` as Python floats, in order. Its ``__name__`` (TRL's
    metric name, ``rewards/<name>/mean``) is ``name``, else the wrapped model's id, else the
    module's class name. It is a plain callable, not an ``nn.Module``, so TRL calls it with
    text instead of treating it as a Hugging Face reward model.

    Args:
        module (TensorDictModuleBase): reads the keys above and writes one reward per row, e.g.
            ``HFRewardModelWrapper(model, tokenizer=rm_tok, history_key=("history", "full"))``.

    Keyword Args:
        history_key (NestedKey or None, optional): Defaults to ``("history", "full")``.
        text_key (NestedKey, optional): Defaults to ``None`` (no text written).
        token_key (NestedKey, optional): Defaults to ``None`` (no tokens written); needs
            ``processing_class``.
        attention_mask_key (NestedKey or None, optional): written with ``token_key``. Defaults
            to ``("masks", "all_attention_mask")``.
        completion_ids_key (NestedKey, optional): Defaults to ``None``.
        kwargs_keys (dict, optional): dataset columns to pass to the module. Defaults to none.
        reward_key (NestedKey, optional): where the module writes the reward. Defaults to the
            module's only ``out_keys`` entry when it has exactly one, else ``"reward"``.
        processing_class (PreTrainedTokenizerBase, optional): renders/tokenizes text for
            ``text_key`` (conversational input) and ``token_key``. Defaults to ``None``.
        max_batch_size (int, optional): the most rows per module call. Defaults to ``None``
            (all rows at once).
        device (torch.device or str, optional): the TensorDict is moved there before the call.
        name (str, optional): the function's ``__name__``.

    Returns:
        a callable ``(prompts, completions, completion_ids=None, **kwargs) -> list[float]``.
        Calling it raises ``KeyError`` if the module writes no ``reward_key`` or a
        ``kwargs_keys`` column is not passed, and ``ValueError`` on standard (string) input with
        neither ``text_key`` nor ``token_key``, on conversational input needing text without
        ``processing_class``, or on a reward that is not one value per completion.

    Raises:
        TypeError: if ``module`` is not a ``TensorDictModuleBase``, or ``name`` is not a str.
        ValueError: if ``token_key`` is given without ``processing_class``, every input key is
            ``None``, two inputs share a key, or ``max_batch_size`` is not a positive int.

    Examples:
        A TorchRL module that scores the length of the last answer, used as a TRL reward
        function on conversational GRPO data:

        >>> import torch
        >>> from tensordict.nn import TensorDictModuleBase
        >>> from torchrl_trl_interop.conversation import history_to_messages
        >>> class AnswerLength(TensorDictModuleBase):
        ...     in_keys, out_keys = [("history", "full")], ["reward"]
        ...     def forward(self, td):
        ...         chats = history_to_messages(td["history", "full"])
        ...         return td.set("reward", torch.tensor([float(len(c[-1]["content"])) for c in chats]))
        >>> reward_func = as_trl_reward_func(AnswerLength())
        >>> reward_func.__name__
        'AnswerLength'
        >>> prompts = [[{"role": "user", "content": "Hi"}]] * 2
        >>> completions = [[{"role": "assistant", "content": "Hello!"}],
        ...                [{"role": "assistant", "content": "Yo"}]]
        >>> reward_func(prompts=prompts, completions=completions, completion_ids=None)
        [6.0, 2.0]
    """
    if not isinstance(module, TensorDictModuleBase):
        raise TypeError(
            "as_trl_reward_func expects a tensordict TensorDictModuleBase that writes a reward "
            f"(e.g. HFRewardModelWrapper), got {type(module).__name__}. A plain Python reward "
            "function can be given to TRL directly."
        )
    if name is not None and not isinstance(name, str):
        raise TypeError(f"as_trl_reward_func: name must be a str, got {type(name).__name__}.")
    if max_batch_size is not None and (
        isinstance(max_batch_size, bool)
        or not isinstance(max_batch_size, int)
        or max_batch_size < 1
    ):
        raise ValueError(
            f"as_trl_reward_func: max_batch_size={max_batch_size!r}; expected None or a positive int."
        )
    if token_key is not None and processing_class is None:
        raise ValueError(
            f"as_trl_reward_func: token_key={token_key!r} needs processing_class= (the tokenizer "
            "the module's model expects) to tokenize prompt + completion."
        )
    kwargs_keys = {str(col): normalize_key(key) for col, key in (kwargs_keys or {}).items()}
    keys = {
        "history_key": history_key,
        "text_key": text_key,
        "token_key": token_key,
        "attention_mask_key": attention_mask_key if token_key is not None else None,
        "completion_ids_key": completion_ids_key,
    }
    keys = {arg: normalize_key(k) for arg, k in keys.items() if k is not None}
    if not keys:
        raise ValueError(
            "as_trl_reward_func: history_key, text_key, token_key and completion_ids_key are "
            "all None, so the module would receive no input. Set the key(s) the module reads."
        )
    used = list(keys.values()) + list(kwargs_keys.values())
    duplicates = sorted({repr(k) for k in used if used.count(k) > 1})
    if duplicates:
        raise ValueError(
            f"as_trl_reward_func: the key(s) {duplicates} are used for two inputs; give each "
            "input its own key."
        )
    return _ModuleRewardFunc(
        module,
        history_key=keys.get("history_key"),
        text_key=keys.get("text_key"),
        token_key=keys.get("token_key"),
        attention_mask_key=keys.get("attention_mask_key"),
        completion_ids_key=keys.get("completion_ids_key"),
        kwargs_keys=kwargs_keys,
        reward_key=normalize_key(_default_reward_key(module) if reward_key is None else reward_key),
        processing_class=processing_class,
        max_batch_size=max_batch_size,
        device=torch.device(device) if device is not None else None,
        name=name if name is not None else _default_name(module),
    )


# ---------------------------------------------------------------------------------------------
# TRL -> TorchRL
# ---------------------------------------------------------------------------------------------


def _flatten(nested: Any, depth: int) -> list:
    if depth == 0:
        return [nested]
    if depth == 1:
        return list(nested)
    return [item for sub in nested for item in _flatten(sub, depth - 1)]


def _to_python(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, (NonTensorData, NonTensorStack)):
        return value.tolist()
    return value


def _column_values(td: TensorDictBase, key: NestedKey, arg: str, owner: str) -> list:
    """One Python value per element of ``td``'s batch, row-major (History -> message lists)."""
    from torchrl.data.llm import History

    if key not in td.keys(True):
        raise KeyError(
            f"{owner}: {arg}={key!r} not found in the input tensordict (keys: "
            f"{_keys_present(td)}). Pass {arg}=... naming where the rollouts hold it."
        )
    try:
        value = td.get(key)
    except RuntimeError:  # a ragged lazy stack of tensors cannot be stacked: go row by row
        return [v for sub in td.unbind(0) for v in _column_values(sub, key, arg, owner)]
    if isinstance(value, History):
        if value.ndim != td.ndim + 1:
            raise ValueError(
                f"{owner}: {arg}={key!r} holds a History of batch size "
                f"{tuple(value.batch_size)}; expected the tensordict's {tuple(td.batch_size)} "
                "plus one turn dimension."
            )
        return _flatten(history_to_messages(value), td.ndim)
    if isinstance(value, torch.Tensor):
        if value.shape[: td.ndim] != td.batch_size:
            raise ValueError(
                f"{owner}: {arg}={key!r} has shape {tuple(value.shape)}; expected leading dims "
                f"{tuple(td.batch_size)}."
            )
        return list(value.reshape(td.batch_size.numel(), *value.shape[td.ndim :]).tolist())
    if isinstance(value, (NonTensorData, NonTensorStack)):
        if td.ndim == 0:
            return [value.tolist() if isinstance(value, NonTensorStack) else value.data]
        return _flatten(value.tolist(), td.ndim)
    raise TypeError(
        f"{owner}: {arg}={key!r} holds a {type(value).__name__}; expected a History, strings "
        "or a tensor."
    )


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
            string (wrap a reward model with ``HFRewardModelWrapper`` instead).
        ValueError: if ``reward_funcs`` is empty, ``weights`` has the wrong length, only one of
            ``prompt_key``/``completion_key`` is given, a non-default ``history_key`` is
            combined with them, ``history_key=None`` is given without them, ``kwargs_keys``
            uses a reserved name (``prompts``, ``completions``, ``completion_ids``), or two
            inputs share a key.

    Examples:
        >>> from tensordict import TensorDict
        >>> from torchrl_trl_interop.conversation import messages_to_history
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
        history_key: NestedKey | None = _DEFAULT_HISTORY_KEY,
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
        weights = [float(w) for w in weights]
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
            if history_key is not None and normalize_key(history_key) != _DEFAULT_HISTORY_KEY:
                raise ValueError(
                    f"TRLRewardFuncWrapper: history_key={history_key!r} and prompt_key/"
                    "completion_key select two different inputs; pass only one of them."
                )
            in_keys = [normalize_key(prompt_key), normalize_key(completion_key)]
        else:
            if history_key is None:
                raise ValueError(
                    "TRLRewardFuncWrapper: history_key=None needs prompt_key= and "
                    "completion_key= (text mode); otherwise there is no input to read."
                )
            in_keys = [normalize_key(history_key)]
        completion_ids_key = (
            None if completion_ids_key is None else normalize_key(completion_ids_key)
        )
        if completion_ids_key is not None:
            in_keys.append(completion_ids_key)
        kwargs_keys = {str(name): normalize_key(key) for name, key in (kwargs_keys or {}).items()}
        reserved = {"prompts", "completions", "completion_ids"} & set(kwargs_keys)
        if reserved:
            raise ValueError(
                f"TRLRewardFuncWrapper: kwargs_keys uses the reserved name(s) {sorted(reserved)}; "
                "they are filled from the History/text keys."
            )
        in_keys.extend(kwargs_keys.values())
        duplicates = sorted({repr(k) for k in in_keys if in_keys.count(k) > 1})
        if duplicates:
            raise ValueError(
                f"TRLRewardFuncWrapper: the key(s) {duplicates} are used for two inputs; give "
                "each input its own key."
            )

        super().__init__()
        self.reward_funcs = funcs
        self.reward_func_names = [_callable_name(f) for f in funcs]
        self.weights = weights
        self.completion_roles = tuple(completion_roles)
        self._text_mode = text_mode
        self._history_key = None if text_mode else normalize_key(history_key)
        self._prompt_key = normalize_key(prompt_key) if text_mode else None
        self._completion_key = normalize_key(completion_key) if text_mode else None
        self._completion_ids_key = completion_ids_key
        self._kwargs_keys = kwargs_keys
        self._reward_key = normalize_key(reward_key)
        self._reward_per_func_key = (
            None if reward_per_func_key is None else normalize_key(reward_per_func_key)
        )
        self.in_keys = in_keys
        self.out_keys = [self._reward_key] + (
            [self._reward_per_func_key] if self._reward_per_func_key is not None else []
        )

    def __repr__(self) -> str:
        fields = [
            f"reward_funcs={self.reward_func_names}",
            f"weights={self.weights}",
            f"in_keys={self.in_keys}",
            f"out_keys={self.out_keys}",
        ]
        body = ",\n    ".join(fields)
        return f"{type(self).__name__}(\n    {body})"

    def _read(self, td: TensorDictBase) -> tuple[list, list, list | None, dict[str, list]]:
        owner = type(self).__name__
        if self._text_mode:
            prompts = _column_values(td, self._prompt_key, "prompt_key", owner)
            completions = _column_values(td, self._completion_key, "completion_key", owner)
        else:
            conversations = _column_values(td, self._history_key, "history_key", owner)
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
                _to_python(v)
                for v in _column_values(td, self._completion_ids_key, "completion_ids_key", owner)
            ]
        )
        kwargs = {
            name: [_to_python(v) for v in _column_values(td, key, f"kwargs_keys[{name!r}]", owner)]
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
        output = output.tolist() if isinstance(output, torch.Tensor) else list(output)
        if len(output) != n:
            raise ValueError(
                f"{type(self).__name__}: reward function {name!r} returned {len(output)} rewards "
                f"but {n} were expected (one per completion)."
            )
        return [float("nan") if r is None else float(r) for r in output]

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Scores every rollout of ``tensordict`` and writes the reward(s).

        Raises:
            KeyError: if an input key is missing (the keys present are listed).
            TypeError: if an input has an unreadable type, or a function returns no list.
            ValueError: if a conversation has no completion turn, an input's shape does not
                match the batch, or a function returns the wrong number of rewards.
        """
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
