"""TorchRL reward modules as TRL reward functions: :func:`as_trl_reward_func`.

The returned callable follows TRL's calling convention exactly: ``f(prompts=..., completions=...,
completion_ids=..., **kwargs) -> list[float]``. On each call it writes the completions into a
TensorDict in the module's input form (``input_mode``: History, text or tokens, one writer per
mode, through ``_rows``), runs the module, and reads the reward back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorDictBase, set_list_to_stack
from tensordict.nn import TensorDictModuleBase
from tensordict.utils import NestedKey

from .._checks import (
    as_device,
    as_mapping,
    boundary,
    check_positive_int,
    check_tokenizer,
    type_error,
)
from .._conversation import is_message_list
from .._keys import (
    ATTENTION_MASK_KEY,
    HISTORY_KEY,
    REWARD_KEY,
    as_nested_key,
    format_keys,
    keys_present,
)
from .._padding import length_buckets, unbucket
from ..data._rows import rows_to_tensordict
from ._input_mode import (
    INPUT_MODES,
    MODE_KEY_ARGS,
    check_distinct_keys,
    mode_key,
    resolve_input_mode,
)

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedTokenizerBase

__all__ = ["DEFAULT_MAX_BATCH_SIZE", "as_trl_reward_func", "module_reward_key"]

#: Rows per module call of :func:`as_trl_reward_func` by default: GRPO scores
#: ``generation_batch_size`` completions of very different lengths at once, and a reward model
#: scoring them sorted by length, 32 at a time, pads far less than in one call.
DEFAULT_MAX_BATCH_SIZE = 32


@dataclass(eq=False, repr=False)
class _ModuleRewardFunc:
    """The callable :func:`as_trl_reward_func` returns (a plain object, not an ``nn.Module``:
    TRL would take an ``nn.Module`` for a Hugging Face reward model and call it on token ids).

    The keys written are in tensordict's canonical form (as in a module's ``in_keys``), ``None``
    for the keys of the other modes.
    """

    module: TensorDictModuleBase
    input_mode: str
    kwargs_keys: dict[str, NestedKey]
    reward_key: NestedKey
    processing_class: PreTrainedTokenizerBase | None
    max_batch_size: int | None
    device: torch.device | None
    name: str
    history_key: NestedKey | None = None
    text_key: NestedKey | None = None
    token_key: NestedKey | None = None
    attention_mask_key: NestedKey | None = None
    completion_ids_key: NestedKey | None = None

    def __post_init__(self) -> None:
        self.__name__ = self.__qualname__ = self.name  # TRL's metric name

    def __repr__(self) -> str:
        key = MODE_KEY_ARGS[self.input_mode]
        return (
            f"as_trl_reward_func({type(self.module).__name__}, name={self.__name__!r}, "
            f"input_mode={self.input_mode!r}, {key}={getattr(self, key)!r}, "
            f"reward_key={self.reward_key!r})"
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
        if self.input_mode == "history":
            if conversational and self.history_key is not None:
                columns.append((self.history_key, [p + c for p, c in zip(prompts, completions)]))
        else:
            columns.extend(self._text_columns(prompts, completions, conversational))
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
                "written as History; pass text_key=... (input_mode='text': the key the module "
                "reads text from) or token_key=... with processing_class=... "
                "(input_mode='tokens')."
            )
        return columns

    def _text_columns(
        self, prompts: list, completions: list, conversational: bool
    ) -> list[tuple[NestedKey, list]]:
        """``"text"`` mode: ``prompt + completion`` as text; ``"tokens"``: tokenized, masked."""
        if conversational and self.processing_class is None:
            key = self.text_key if self.input_mode == "text" else self.token_key
            raise ValueError(
                f"{self.__name__}: conversational prompts/completions need processing_class= "
                f"to be rendered as text for input_mode={self.input_mode!r} (key {key!r}); pass "
                "the tokenizer whose chat template the module expects, or read History with "
                "input_mode='history'."
            )
        texts = [self._render(p, c, conversational) for p, c in zip(prompts, completions)]
        if self.input_mode == "text":
            return [(self.text_key, texts)]
        # as TRL tokenizes reward-model input: rendered text, no extra special tokens
        ids = [list(i) for i in self.processing_class(texts, add_special_tokens=False)["input_ids"]]
        columns = [(self.token_key, ids)]
        if self.attention_mask_key is not None:
            columns.append((self.attention_mask_key, [[True] * len(i) for i in ids]))
        return columns

    def _score(self, columns: list[tuple[NestedKey, list]], index: Sequence[int]) -> list[float]:
        names = [f"#{i}" for i in range(len(columns))]
        rows = [{name: values[i] for name, (_, values) in zip(names, columns)} for i in index]
        rename = {name: key for name, (key, _) in zip(names, columns)}
        with set_list_to_stack(True):
            td = rows_to_tensordict(rows, rename=rename)
            if self.device is not None:
                td = td.to(self.device)
            with torch.no_grad():
                out = self.module(td)
        out = out if isinstance(out, TensorDictBase) else td
        if self.reward_key not in out.keys(True):
            raise KeyError(
                f"{self.__name__}: the module wrote no reward at reward_key={self.reward_key!r} "
                f"(keys after the call: {keys_present(out)}). Pass reward_key=... naming the "
                "module's output."
            )
        reward = out.get(self.reward_key)
        if not isinstance(reward, torch.Tensor) or reward.numel() != len(rows):
            raise ValueError(
                f"{self.__name__}: the module's reward at {self.reward_key!r} is "
                f"{getattr(reward, 'shape', type(reward).__name__)}; expected one value per "
                f"completion ({len(rows)})."
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
        # rows sorted by length and cut into buckets, as HFRewardModelWrapper cuts its rows:
        # each module call then pads only to its own longest row
        lengths = torch.tensor(
            [_text_length(p) + _text_length(c) for p, c in zip(prompts, completions)]
        )
        buckets = length_buckets(lengths, self.max_batch_size)
        if buckets is None:
            return self._score(columns, range(len(prompts)))
        rewards = [torch.tensor(self._score(columns, b.tolist())) for b in buckets]
        return unbucket(rewards, buckets).tolist()


def _text_length(value: Any) -> int:
    """Characters of a prompt or completion (text or message list): the length rows sort by."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, (list, tuple)):
        return sum(_text_length(m.get("content", "")) if isinstance(m, dict) else 0 for m in value)
    return 0


def _default_name(module: Any) -> str:
    model = getattr(module, "model", None)
    path = getattr(getattr(model, "config", None), "_name_or_path", "") or ""
    if path:
        return path.rstrip("/").split("/")[-1]  # TRL names reward models by their model id
    return type(module).__name__


def module_reward_key(module: Any) -> NestedKey:
    """The module's single out key (e.g. a wrapper built with ``reward_key="rm_reward"``), else
    ``"reward"``: where a reward module writes its reward, in canonical form."""
    out_keys = list(getattr(module, "out_keys", None) or [])
    return as_nested_key(out_keys[0]) if len(out_keys) == 1 else REWARD_KEY


@boundary("as_trl_reward_func")
def as_trl_reward_func(
    module: TensorDictModuleBase,
    *,
    input_mode: str | None = None,
    history_key: NestedKey | None = HISTORY_KEY,
    text_key: NestedKey | None = None,
    token_key: NestedKey | None = None,
    attention_mask_key: NestedKey | None = ATTENTION_MASK_KEY,
    completion_ids_key: NestedKey | None = None,
    kwargs_keys: Mapping[str, NestedKey] | None = None,
    reward_key: NestedKey | None = None,
    processing_class: PreTrainedTokenizerBase | None = None,
    max_batch_size: int | None = DEFAULT_MAX_BATCH_SIZE,
    device: torch.device | str | None = None,
    name: str | None = None,
) -> Callable[..., list[float]]:
    """Turns a TorchRL reward module into a TRL reward function (``GRPOTrainer(reward_funcs=...)``).

    The returned callable has TRL's signature ``(prompts, completions, completion_ids, **kwargs)
    -> list[float]``. On each call it builds a ``[N]`` TensorDict (``N`` = number of
    completions) holding ``prompt + completion`` in the form the module reads, ``input_mode``
    (TorchRL's names), at that mode's key, plus the completion ids TRL passed at
    ``completion_ids_key`` and the dataset columns of ``kwargs_keys`` (``{column: key}``):

    ============== ================= ==========================================================
    ``input_mode`` key               value, per completion
    ============== ================= ==========================================================
    ``"history"``  ``history_key``   ``History`` of ``prompt + completion`` (conversational
                                     input; nothing for standard text)
    ``"text"``     ``text_key``      ``prompt + completion`` as text: joined (standard) or
                                     rendered with ``processing_class``'s chat template
    ``"tokens"``   ``token_key``     that text tokenized by ``processing_class`` (no special
                                     tokens added, as TRL tokenizes reward-model input),
                                     ragged, and an all-``True`` mask at ``attention_mask_key``
    ============== ================= ==========================================================

    It runs ``module`` on it under :func:`torch.no_grad` (rows sorted by length, in buckets of
    ``max_batch_size``, as :class:`~torchrl_trl_interop.HFRewardModelWrapper` buckets) and
    returns the reward at ``reward_key`` as Python floats, in order. Its ``__name__`` (TRL's
    metric name, ``rewards/<name>/mean``) is ``name``, else the wrapped model's id, else the
    module's class name. It is a plain callable, not an ``nn.Module``, so TRL calls it with
    text instead of treating it as a Hugging Face reward model. Code written before
    ``input_mode`` runs unchanged: without it, ``text_key=`` or ``token_key=`` selects its mode
    (a key argument equal to its default counts as not given).

    Args:
        module (TensorDictModuleBase): reads the keys above and writes one reward per row, e.g.
            ``HFRewardModelWrapper(model, tokenizer=rm_tok, input_mode="history")``.

    Keyword Args:
        input_mode (str, optional): ``"history"``, ``"text"`` or ``"tokens"``: the form the
            module reads. Defaults to ``None``: the mode of the key argument given
            (``text_key`` or ``token_key``), else ``"history"``.
        history_key (NestedKey or None, optional): ``"history"`` mode. ``None`` writes no
            History (for a module that reads only ``completion_ids_key``). Defaults to
            ``("history", "full")``.
        text_key (NestedKey, optional): ``"text"`` mode. Defaults to ``None``:
            ``("text", "full")`` in ``"text"`` mode.
        token_key (NestedKey, optional): ``"tokens"`` mode; needs ``processing_class``.
            Defaults to ``None``: ``("tokens", "full")`` in ``"tokens"`` mode.
        attention_mask_key (NestedKey or None, optional): ``"tokens"`` mode, written with the
            tokens. Defaults to ``("masks", "all_attention_mask")``.
        completion_ids_key (NestedKey, optional): Defaults to ``None``.
        kwargs_keys (dict, optional): dataset columns to pass to the module. Defaults to none.
        reward_key (NestedKey, optional): where the module writes the reward. Defaults to the
            module's only ``out_keys`` entry when it has exactly one, else ``"reward"``.
        processing_class (PreTrainedTokenizerBase, optional): renders conversational input as
            text (``"text"`` mode) and tokenizes it (``"tokens"`` mode). Defaults to ``None``.
        max_batch_size (int or None, optional): the most rows per module call. Rows are sorted
            by text length (prompt + completion) and cut into buckets of this size, so a reward
            model pads each call only to its own longest row; rewards come back in the original
            order. ``None`` scores all rows in one call (for a module that looks at rows
            together, or to get exactly the scores of one module call: a low-precision model,
            e.g. bfloat16, can score a row slightly differently at another padded width).
            Defaults to ``32`` (``DEFAULT_MAX_BATCH_SIZE``).
        device (torch.device or str, optional): the TensorDict is moved there before the call.
        name (str, optional): the function's ``__name__``.

    Returns:
        a callable ``(prompts, completions, completion_ids=None, **kwargs) -> list[float]``,
        raising ``KeyError`` if the module writes no ``reward_key`` or a ``kwargs_keys`` column
        is not passed, ``ValueError`` on input its mode cannot write (standard text as History,
        conversations as text without ``processing_class``) or if the module does not write
        one reward per completion.

    Raises:
        TypeError: if ``module`` is not a ``TensorDictModuleBase``, or ``name`` is not a str.
        ValueError: if ``input_mode`` is unknown, a key argument of another mode than
            ``input_mode`` is given (without ``input_mode``: key arguments of two modes),
            ``"tokens"`` mode has no ``processing_class``, every input key is ``None``, two
            inputs share a key, or ``max_batch_size`` is not a positive int.

    Examples:
        A TorchRL module that scores the length of the last answer, used as a TRL reward
        function on conversational GRPO data:

        >>> import torch
        >>> from tensordict.nn import TensorDictModuleBase
        >>> from torchrl_trl_interop import history_to_messages
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

        A reward model reading text, used on standard (string) GRPO data:

        >>> from torchrl_trl_interop import HFRewardModelWrapper
        >>> from torchrl_trl_interop.testing import toy_reward_model, toy_tokenizer
        >>> rm = HFRewardModelWrapper(toy_reward_model(), input_mode="text",
        ...                           tokenizer=toy_tokenizer(), append_eos=False)
        >>> as_trl_reward_func(rm, input_mode="text")
        as_trl_reward_func(HFRewardModelWrapper, name='HFRewardModelWrapper', input_mode='text', text_key=('text', 'full'), reward_key='reward')
    """
    if not isinstance(module, TensorDictModuleBase):
        expected = "a tensordict TensorDictModuleBase that writes a reward (HFRewardModelWrapper)"
        hint = " A plain Python reward function can be given to TRL directly."
        raise type_error("module", expected, module, hint)
    if name is not None and not isinstance(name, str):
        raise type_error("name", "a str", name)
    input_mode = resolve_input_mode(  # first: it reads the arguments as passed
        as_trl_reward_func, locals(), modes=INPUT_MODES, default="history"
    )
    check_positive_int(max_batch_size, "max_batch_size", allow_none=True)
    check_tokenizer(processing_class, "processing_class")
    kwargs_keys = as_mapping(kwargs_keys, "kwargs_keys", "{column: key}")
    kwargs_keys = {
        str(col): as_nested_key(key, f"kwargs_keys[{col!r}]") for col, key in kwargs_keys.items()
    }
    if input_mode == "history":
        keys = {"history_key": history_key}
    elif input_mode == "text":
        keys = {"text_key": mode_key("text", text_key)}
    else:
        token_key = mode_key("tokens", token_key)
        keys = {"token_key": token_key, "attention_mask_key": attention_mask_key}
        if processing_class is None:
            raise ValueError(
                f"token_key={token_key!r} (input_mode='tokens') needs processing_class= (the "
                "tokenizer the module's model expects) to tokenize prompt + completion."
            )
    keys["completion_ids_key"] = completion_ids_key
    keys = {arg: as_nested_key(k, arg) for arg, k in keys.items() if k is not None}
    if not keys:
        raise ValueError(
            "history_key, text_key, token_key and completion_ids_key are all None, so the "
            "module would receive no input. Set the key(s) the module reads."
        )
    check_distinct_keys([*keys.values(), *kwargs_keys.values()])
    if reward_key is None:
        reward_key = module_reward_key(module)
    return _ModuleRewardFunc(
        module,
        input_mode=input_mode,
        kwargs_keys=kwargs_keys,
        reward_key=as_nested_key(reward_key, "reward_key"),
        processing_class=processing_class,
        max_batch_size=max_batch_size,
        device=as_device(device, "device"),
        name=name if name is not None else _default_name(module),
        **keys,
    )
