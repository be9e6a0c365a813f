"""Hugging Face datasets into torchrl replay buffers: TRL data moved into TorchRL storages.

The inverse of :meth:`TorchRLBufferDataset.to_hf_dataset
<torchrl_trl_interop.TorchRLBufferDataset.to_hf_dataset>`: every row of a dataset
in any TRL format is written to a :class:`~torchrl.data.ReplayBuffer`, conversational columns as
:class:`~torchrl.data.llm.History`, so a round trip gives back the same rows.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tensordict.utils import NestedKey
from torchrl.data import LazyStackStorage, ReplayBuffer

from .._checks import (
    as_mapping,
    as_names,
    boundary,
    check_among,
    check_positive_int,
    type_error,
)
from .._keys import format_keys
from ._processes import check_replay_buffer
from ._rows import extend_with_rows

if TYPE_CHECKING:  # pragma: no cover
    import datasets
    from torchrl.data.replay_buffers.storages import Storage

__all__ = ["replay_buffer_from_hf"]


def _num_rows(dataset: Any) -> int | None:
    try:
        return len(dataset)
    except TypeError:  # datasets.IterableDataset, generators
        return None


def _column_names(dataset: Any) -> list[str] | None:
    names = getattr(dataset, "column_names", None)
    return list(names) if names is not None else None


@boundary("replay_buffer_from_hf")
def replay_buffer_from_hf(
    dataset: datasets.Dataset | datasets.IterableDataset | Iterable[dict[str, Any]],
    *,
    replay_buffer: ReplayBuffer | None = None,
    storage: Storage | None = None,
    batch_size: int | None = None,
    columns: Sequence[str] | None = None,
    rename: Mapping[str, NestedKey] | None = None,
    max_rows: int | None = None,
    chunk_size: int = 1024,
) -> ReplayBuffer:
    """Writes a Hugging Face dataset (any TRL format) into a torchrl :class:`~torchrl.data.ReplayBuffer`.

    Every TRL layout is accepted: preference (``prompt``/``chosen``/``rejected``, explicit or
    implicit prompt), prompt-only, prompt-completion, ``messages`` and ``text``, in standard
    (strings) or conversational (message lists) form, plus any extra column. Rows keep their
    dataset order in the storage. Per column:

    ================================== =======================================================
    dataset column                     stored as
    ================================== =======================================================
    message lists ``[{"role", ...}]``  :class:`~torchrl.data.llm.History` ``[T]`` per row (a
                                       :class:`~torchrl_trl_interop.MessageHistory` for every
                                       row when some message holds other fields, e.g.
                                       ``reasoning_content`` or ``tool_call_id``)
    ``str``, ``None``, other objects   ``NonTensorData`` (kept as-is)
    ``bool`` / ``int`` / ``float``     0-d tensor (``bool`` / ``int64`` / ``float64``)
    list of numbers (e.g. ``*_ids``)   1-d tensor per row (ragged across rows)
    ================================== =======================================================

    ``TorchRLBufferDataset(buffer, ...).to_hf_dataset()`` gives the rows back unchanged, every
    field of every message included.

    Args:
        dataset (datasets.Dataset, datasets.IterableDataset or iterable of dict): the rows.

    Keyword Args:
        replay_buffer (ReplayBuffer, optional): a buffer to extend. Its storage must keep one
            value per row for strings and History (``LazyStackStorage`` or ``ListStorage``; a
            ``LazyTensorStorage`` holds strings but not ragged History). Defaults to a new
            ``ReplayBuffer`` over ``storage``.
        storage (Storage, optional): storage of the new buffer. Defaults to
            ``LazyStackStorage(max_size=number of rows)``. Exclusive with ``replay_buffer``.
        batch_size (int, optional): ``batch_size`` of the new buffer (used by ``sample()``).
            Exclusive with ``replay_buffer``.
        columns (list of str, optional): only these columns are written (a single str is one
            column). Defaults to all.
        rename (dict, optional): maps a column to the (nested) key it is stored under, e.g.
            ``{"prompt": ("history", "prompt")}``; the dataset side reads it back with
            ``TorchRLBufferDataset(..., rename={("history", "prompt"): "prompt"})``.
        max_rows (int, optional): write at most this many rows (needed to size the default
            storage of a ``datasets.IterableDataset``, which has no length; without it the
            stream is read to the end first).
        chunk_size (int, optional): rows converted and written per ``extend`` call.
            Defaults to ``1024``.

    Returns:
        the replay buffer holding the rows.

    Raises:
        TypeError: if ``dataset`` is not an iterable of rows or yields something else than
            dict rows, ``replay_buffer`` is not a ReplayBuffer, ``storage`` not a Storage,
            ``columns`` not a str or list of str, or ``rename`` not a dict.
        ValueError: if ``replay_buffer`` is combined with ``storage``/``batch_size``, the
            dataset is empty or holds more rows than the storage's ``max_size`` (checked before
            anything is written), a size argument is not a positive int, or a column mixes
            conversations with other values or changes type between rows (conversations with
            message fields History has no slot for, after a chunk of plain ones, included).
        KeyError: if ``columns`` or ``rename`` names a column the dataset does not have.

    Examples:
        >>> from datasets import Dataset
        >>> from torchrl_trl_interop import TorchRLBufferDataset
        >>> data = Dataset.from_list([
        ...     {"prompt": [{"role": "user", "content": "2+2?"}],
        ...      "chosen": [{"role": "assistant", "content": "4"}],
        ...      "rejected": [{"role": "assistant", "content": "5"}]},
        ...     {"prompt": [{"role": "system", "content": "Be brief."},
        ...                 {"role": "user", "content": "Hi"}],
        ...      "chosen": [{"role": "assistant", "content": "Hello!"}],
        ...      "rejected": [{"role": "assistant", "content": "Go away."}]},
        ... ])
        >>> rb = replay_buffer_from_hf(data)
        >>> len(rb), type(rb[0]["prompt"]).__name__
        (2, 'History')

        Back to a Hugging Face dataset, the same rows:

        >>> TorchRLBufferDataset(rb, batch_size=2).to_hf_dataset().to_list() == data.to_list()
        True
    """
    if (
        dataset is None
        or isinstance(dataset, (str, bytes, Mapping))
        or not isinstance(dataset, Iterable)
    ):
        expected = "a datasets.Dataset, a datasets.IterableDataset or an iterable of dict rows"
        raise type_error("dataset", expected, dataset)
    check_positive_int(max_rows, "max_rows", allow_none=True)
    check_positive_int(chunk_size, "chunk_size")
    check_positive_int(batch_size, "batch_size", allow_none=True)
    columns = None if columns is None else list(as_names(columns, "columns"))
    rename = None if rename is None else as_mapping(rename, "rename", "{column: key}")
    if storage is not None and not callable(getattr(storage, "set", None)):
        raise TypeError(
            "storage must be a torchrl Storage (e.g. LazyStackStorage(n)), got "
            f"{type(storage).__name__}."
        )
    if replay_buffer is not None:
        check_replay_buffer(replay_buffer)
        if storage is not None or batch_size is not None:
            raise ValueError(
                "storage= and batch_size= configure a new buffer and cannot be combined with "
                "replay_buffer=; configure the buffer you pass instead."
            )
    names = _column_names(dataset)
    for arg, wanted in (("columns=", columns), ("rename=", rename)):
        if wanted is not None and names is not None:
            check_among(wanted, names, arg, "the dataset's columns")
    if columns is not None and rename is not None:
        check_among(rename, columns, "rename=", "the columns kept by columns=")

    rows: Iterable[dict[str, Any]] = iter(dataset)
    if max_rows is not None:
        rows = itertools.islice(rows, max_rows)
    num_rows = _num_rows(dataset)
    if num_rows is not None and max_rows is not None:
        num_rows = min(num_rows, max_rows)
    if replay_buffer is None:
        if num_rows is None and storage is None:
            rows = list(rows)  # a stream without length: read it to size the storage
            num_rows = len(rows)
            rows = iter(rows)
        if num_rows == 0:
            raise ValueError("the dataset has no rows; nothing to store.")
        if storage is None:
            storage = LazyStackStorage(max_size=num_rows)
        replay_buffer = ReplayBuffer(storage=storage, batch_size=batch_size)
    capacity = getattr(getattr(replay_buffer, "storage", None), "max_size", None)
    if isinstance(capacity, int):
        streamed = num_rows is None
        if streamed:  # read at most one row more than fits, before writing any
            rows = list(itertools.islice(rows, capacity + 1))
            num_rows = len(rows)
            rows = iter(rows)
        if num_rows > capacity:
            count = f"more than {capacity}" if streamed else str(num_rows)
            raise ValueError(
                f"the dataset has {count} rows but the buffer's "
                f"{type(replay_buffer.storage).__name__} holds {capacity} (max_size); writing "
                "them would overwrite the first rows with the last ones. Give the storage "
                "room for every row, or pass max_rows=... to write only the first ones."
            )

    kinds: dict[str, Any] | None = None
    written = 0
    rows = iter(rows)
    while True:
        chunk = list(itertools.islice(rows, chunk_size))
        if not chunk:
            break
        for i, row in enumerate(chunk):
            if not isinstance(row, Mapping):
                raise TypeError(
                    f"row {written + i} is a {type(row).__name__}; expected dict rows (a "
                    "datasets.Dataset / IterableDataset or an iterable of dicts)."
                )
        if columns is not None:
            try:
                chunk = [{c: row[c] for c in columns} for row in chunk]
            except KeyError as err:
                raise KeyError(
                    f"column {err.args[0]!r} from columns= is missing in the rows (row "
                    f"columns: {format_keys(chunk[0])})."
                ) from err
        else:
            chunk = [dict(row) for row in chunk]
        kinds = extend_with_rows(replay_buffer, chunk, rename=dict(rename or {}), kinds=kinds)
        written += len(chunk)
    if written == 0:
        raise ValueError("the dataset has no rows; nothing to store.")
    return replay_buffer
