"""Saving a replay buffer to disk atomically, text included: :func:`save_replay_buffer`.

A buffer is saved with torchrl's ``ReplayBuffer.dumps`` (storage, sampler, writer, generator)
into a temporary directory next to its destination, flushed to disk, then renamed into place:
a crash while saving leaves either the whole buffer or none of it, never half. torchrl's own
storage checkpointers cannot save text faithfully (``ListStorage``/``LazyStackStorage`` refuse,
and ``LazyTensorStorage`` writes every row's strings as the first row's, measured on torchrl
0.14.1), so those storages are saved as their rows (``torch.save`` of the stored tensordicts).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDictBase
from torchrl.data import ReplayBuffer
from torchrl.data.replay_buffers.checkpointers import (
    ListStorageCheckpointer,
    StorageCheckpointerBase,
    TensorStorageCheckpointer,
)
from torchrl.data.replay_buffers.storages import TensorStorage

from .._keys import _is_leaf
from ._processes import is_remote

__all__ = ["check_checkpointable", "is_complete", "load_replay_buffer", "save_replay_buffer"]

_FORMAT_FILE = "format.json"
_FORMAT_VERSION = 1


class _RowsCheckpointer(StorageCheckpointerBase):
    """Saves a storage as its rows: what ``storage.get(range(len))`` returns, pickled."""

    def dumps(self, storage: Any, path: Any) -> None:
        path = Path(path)
        path.mkdir(exist_ok=True)
        n = len(storage)
        rows = storage.get(list(range(n))) if n else None
        with open(path / "rows.pt", "wb") as file:
            torch.save({"len": n, "rows": rows}, file)

    def loads(self, storage: Any, path: Any) -> None:
        with open(Path(path) / "rows.pt", "rb") as file:
            saved = torch.load(file, weights_only=False)  # our own file: rows hold strings
        if len(storage):
            storage._empty()
        if saved["len"]:
            storage.set(list(range(saved["len"])), saved["rows"])


def _holds_text(storage: TensorStorage) -> bool:
    if not storage.initialized:
        return False
    data = storage._storage
    if not isinstance(data, TensorDictBase):
        return False
    leaves = data.keys(include_nested=True, leaves_only=True, is_leaf=_is_leaf)
    return any(not isinstance(data.get(k), torch.Tensor) for k in leaves)  # text, History


def _storage_format(replay_buffer: ReplayBuffer) -> str:
    """``"rows"`` where torchrl's checkpointer would lose or refuse data, else ``"torchrl"``."""
    storage = replay_buffer.storage
    checkpointer = storage.checkpointer
    if type(checkpointer) is ListStorageCheckpointer:
        return "rows"
    if type(checkpointer) is TensorStorageCheckpointer and (
        not storage.initialized or _holds_text(storage)
    ):
        return "rows"
    return "torchrl"  # torchrl's tensor checkpointer, or one the user chose


@contextmanager
def _checkpointing(replay_buffer: ReplayBuffer, fmt: str | None = None) -> Iterator[str]:
    """Holds the buffer's lock with the checkpointer of ``fmt`` (decided under the lock when
    ``None``) in place of the storage's own; yields the format."""
    lock = getattr(replay_buffer, "_replay_lock", None) or nullcontext()
    with lock:
        fmt = fmt or _storage_format(replay_buffer)
        storage = replay_buffer.storage
        own = storage.checkpointer
        if fmt == "rows":
            storage.checkpointer = _RowsCheckpointer()
        try:
            yield fmt
        finally:
            storage.checkpointer = own


def check_checkpointable(replay_buffer: Any, owner: str) -> None:
    """Raises a clear error for a buffer these functions cannot save faithfully."""
    if is_remote(replay_buffer):
        raise TypeError(
            f"{owner}: a {type(replay_buffer).__name__} lives in a Ray actor, which writes its "
            "checkpoint on its own machine. Save it there with replay_buffer.dumps(path) (and "
            ".loads(path) on resume) from a callback of your own."
        )
    if not isinstance(replay_buffer, ReplayBuffer):
        raise TypeError(
            f"{owner}: replay_buffer must be a torchrl ReplayBuffer, got "
            f"{type(replay_buffer).__name__}."
        )


def _fsync_tree(root: Path) -> None:
    for folder, _, files in os.walk(root):
        for name in files:
            with open(os.path.join(folder, name), "rb") as file:
                os.fsync(file.fileno())
        _fsync_dir(Path(folder))


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory handles
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def save_replay_buffer(replay_buffer: ReplayBuffer, path: str | os.PathLike) -> Path:
    """Saves ``replay_buffer`` at ``path``, atomically: ``path`` then holds all of it or is unchanged.

    The buffer is written into a temporary directory beside ``path``, flushed to disk, and
    renamed to ``path`` (an existing ``path`` is replaced). Writes from other threads through
    the buffer's ``add``/``extend`` wait until the save is done. Load it with
    :func:`load_replay_buffer` into a buffer built the same way.

    Examples:
        >>> import tempfile
        >>> from torchrl.data import LazyTensorStorage
        >>> from torchrl_trl_interop.testing import toy_buffer
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     path = save_replay_buffer(toy_buffer(5), f"{tmp}/rb")
        ...     restored = toy_buffer(0, storage=LazyTensorStorage(5))  # built like the saved one
        ...     load_replay_buffer(restored, path)
        >>> restored[:]["x"].tolist()
        [0, 1, 2, 3, 4]
    """
    check_checkpointable(replay_buffer, "save_replay_buffer")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    old: Path | None = None
    try:
        with _checkpointing(replay_buffer) as fmt:
            replay_buffer.dumps(tmp / "buffer")
        with open(tmp / _FORMAT_FILE, "w") as file:
            json.dump({"version": _FORMAT_VERSION, "storage": fmt}, file)
        _fsync_tree(tmp)
        if path.exists():
            old = path.with_name(f".{path.name}.old-{os.getpid()}-{threading.get_ident()}")
            os.replace(path, old)
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not path.exists():
            os.replace(old, path)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return path


def is_complete(path: str | os.PathLike) -> bool:
    """Whether ``path`` holds a buffer saved whole by :func:`save_replay_buffer`."""
    return (Path(path) / _FORMAT_FILE).is_file()


def load_replay_buffer(replay_buffer: ReplayBuffer, path: str | os.PathLike) -> None:
    """Loads a buffer saved by :func:`save_replay_buffer` into ``replay_buffer``, replacing its content.

    ``replay_buffer`` must be built like the saved one (storage type and size, sampler, writer).

    Raises:
        FileNotFoundError: if ``path`` holds no complete saved buffer.
    """
    check_checkpointable(replay_buffer, "load_replay_buffer")
    path = Path(path)
    if not is_complete(path):
        raise FileNotFoundError(
            f"load_replay_buffer: no saved replay buffer at {str(path)!r} (expected the "
            f"directory written by save_replay_buffer, with a {_FORMAT_FILE!r} file). A save "
            "interrupted by a crash leaves nothing there: resume from an earlier checkpoint "
            "(last_complete_checkpoint(output_dir) finds the newest complete one)."
        )
    with open(path / _FORMAT_FILE) as file:
        fmt = json.load(file)["storage"]
    with _checkpointing(replay_buffer, fmt):
        replay_buffer.loads(path / "buffer")
    writer = replay_buffer.writer
    if hasattr(writer, "_commit_log"):  # CommittedWriter: publish the restored length
        writer._commit_log[1] = len(replay_buffer.storage)
