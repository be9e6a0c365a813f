"""Saving a replay buffer to disk atomically, text included: :func:`save_replay_buffer`.

A buffer is saved with torchrl's ``ReplayBuffer.dumps`` (storage, sampler, writer, generator)
into a temporary directory next to its destination, flushed to disk, then renamed into place:
a crash while saving leaves either the whole buffer or none of it, never half. torchrl's own
storage checkpointers cannot save text faithfully (``ListStorage``/``LazyStackStorage`` refuse,
and ``LazyTensorStorage`` writes every row's strings as the first row's, measured on torchrl
0.14.1), so those storages are saved as their rows (``torch.save`` of the stored tensordicts).

``format.json``, written last, says how: the format version, the storage format, how the buffer
was built (storage type and size, sampler, writer) and every file of the save with its size. A
save is loaded only when every listed file is there whole, into a buffer built the same way.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
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

from .._checks import boundary
from .._keys import _is_leaf
from .._upstream._buffers import empty_storage, replay_lock, storage_data
from ._processes import check_local, check_replay_buffer

__all__ = [
    "check_checkpointable",
    "is_complete",
    "load_replay_buffer",
    "save_replay_buffer",
]

_FORMAT_FILE = "format.json"
#: 1: ``{"version", "storage"}``; 2 adds ``"buffer"`` (how it was built) and ``"files"`` (sizes).
_FORMAT_VERSION = 2
_SAVED_ENTRIES = {_FORMAT_FILE, "buffer"}  # what a directory written by save_replay_buffer holds
_BUILT_KEYS = {"storage", "max_size", "sampler", "writer"}  # how a saved buffer was built


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
            empty_storage(storage)
        if saved["len"]:
            storage.set(list(range(saved["len"])), saved["rows"])


def _holds_text(storage: TensorStorage) -> bool:
    if not storage.initialized:
        return False
    data = storage_data(storage)
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
    with replay_lock(replay_buffer):
        fmt = fmt or _storage_format(replay_buffer)
        storage = replay_buffer.storage
        own = storage.checkpointer
        if fmt == "rows":
            storage.checkpointer = _RowsCheckpointer()
        try:
            yield fmt
        finally:
            storage.checkpointer = own


def _built(replay_buffer: ReplayBuffer) -> dict[str, Any]:
    """How ``replay_buffer`` is built, as far as loading a save into it depends on it."""
    storage = replay_buffer.storage
    return {
        "storage": type(storage).__name__,
        "max_size": getattr(storage, "max_size", None),
        "sampler": type(replay_buffer.sampler).__name__,
        "writer": type(replay_buffer.writer).__name__,
    }


def _describe(built: dict[str, Any]) -> str:
    return (
        f"{built['storage']}(max_size={built['max_size']}), sampler {built['sampler']}, "
        f"writer {built['writer']}"
    )


def _file_sizes(root: Path) -> dict[str, int]:
    """``{relative path: size}`` of every file under ``root``."""
    out = {}
    for folder, _, files in os.walk(root):
        for name in files:
            file = Path(folder, name)
            out[file.relative_to(root).as_posix()] = file.stat().st_size
    return dict(sorted(out.items()))


def check_checkpointable(replay_buffer: Any) -> None:
    """Raises a clear error for a buffer these functions cannot save faithfully."""
    check_local(
        replay_buffer,
        TypeError,
        "lives in a Ray actor, which writes its checkpoint on its own machine. Save it there with "
        "replay_buffer.dumps(path) (and .loads(path) on resume) from a callback of your own.",
    )
    check_replay_buffer(replay_buffer)


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


def _check_replaceable(path: Path) -> None:
    """Refuses a ``path`` that holds something else than a buffer this module saved."""
    if path.is_symlink():
        raise FileExistsError(
            f"{str(path)!r} is a symbolic link; a save replaces only a directory written by "
            "save_replay_buffer, so it is left alone. Pass another path."
        )
    if not path.exists():
        return
    if not path.is_dir():
        raise NotADirectoryError(
            f"{str(path)!r} exists and is not a directory (a file of yours?); a save replaces "
            "only a directory written by save_replay_buffer, so it is left alone. Pass "
            "another path, or remove it first."
        )
    entries = set(os.listdir(path))
    if entries and (_FORMAT_FILE not in entries or not entries <= _SAVED_ENTRIES):
        raise FileExistsError(
            f"{str(path)!r} is a directory holding {sorted(entries)[:8]}, not a replay buffer "
            f"saved by save_replay_buffer (which holds {sorted(_SAVED_ENTRIES)}); it is left "
            "alone. Pass another path, or empty it first."
        )


@boundary("save_replay_buffer")
def save_replay_buffer(replay_buffer: ReplayBuffer, path: str | os.PathLike) -> Path:
    """Saves ``replay_buffer`` at ``path``, atomically: ``path`` then holds all of it or is unchanged.

    The buffer is written into a temporary directory beside ``path``, flushed to disk, and
    renamed to ``path``. An existing ``path`` is replaced only if it is an empty directory or a
    buffer saved by this function. Writes from other threads through the buffer's
    ``add``/``extend`` wait until the save is done. Load it with :func:`load_replay_buffer`
    into a buffer built the same way.

    Raises:
        NotADirectoryError: if ``path`` exists and is not a directory (it is left alone).
        FileExistsError: if ``path`` is a symbolic link or a directory holding anything else
            than a saved buffer (it is left alone).

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
    check_checkpointable(replay_buffer)
    path = Path(path)
    _check_replaceable(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    old: Path | None = None
    try:
        with _checkpointing(replay_buffer) as fmt:
            replay_buffer.dumps(tmp / "buffer")
            built = _built(replay_buffer)
        saved = {"version": _FORMAT_VERSION, "storage": fmt, "buffer": built}
        saved["files"] = _file_sizes(tmp)
        with open(tmp / _FORMAT_FILE, "w") as file:
            json.dump(saved, file)
        _fsync_tree(tmp)
        _check_replaceable(path)  # again: something may have been put there meanwhile
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


_RESUME_EARLIER = (
    "Resume from an earlier checkpoint (last_complete_checkpoint(output_dir) finds the newest "
    "complete one)."
)


def _damaged(path: Path, what: str) -> ValueError:
    return ValueError(
        f"the replay buffer saved at {str(path)!r} is damaged: {what}. {_RESUME_EARLIER}"
    )


def _parse_format(path: Path) -> dict[str, Any]:
    """``path/format.json``, parsed; any version, newer ones included.

    Raises:
        FileNotFoundError: if there is no ``format.json``.
        ValueError: if it is unreadable or holds no format version.
    """
    file = path / _FORMAT_FILE
    if not file.is_file():
        raise FileNotFoundError(
            f"no saved replay buffer at {str(path)!r} (expected the directory written by "
            f"save_replay_buffer, with a {_FORMAT_FILE!r} file). A save interrupted by a crash "
            f"leaves nothing there. {_RESUME_EARLIER}"
        )
    try:
        saved = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise _damaged(path, f"{_FORMAT_FILE} cannot be read ({err})") from err
    version = saved.get("version") if isinstance(saved, dict) else None
    if type(version) is not int or version < 1:
        raise _damaged(path, f"{_FORMAT_FILE} holds no format version (got {saved!r:.200})")
    return saved


def _check_saved(path: Path, saved: dict[str, Any]) -> None:
    """Checks a save of a known version: its storage format, its build, every file it lists.

    Raises:
        FileNotFoundError: if a listed file is missing.
        ValueError: if ``format.json`` lacks a field, or a file has another size than saved.
    """
    if saved.get("storage") not in ("rows", "torchrl"):
        raise _damaged(path, f"{_FORMAT_FILE} names no storage format (got {saved!r:.200})")
    if saved["version"] == 1:
        return  # written before files and builds were recorded: nothing more to check
    files, built = saved.get("files"), saved.get("buffer")
    if not isinstance(files, dict) or not isinstance(built, dict) or set(built) != _BUILT_KEYS:
        raise _damaged(path, f"{_FORMAT_FILE} lacks its file list or build (got {saved!r:.200})")
    for name, size in files.items():
        listed = path / name
        if not listed.is_file():
            raise FileNotFoundError(
                f"the replay buffer saved at {str(path)!r} is damaged: its file {name!r} is "
                f"missing ({_FORMAT_FILE} lists the {len(files)} files it was saved with). "
                f"{_RESUME_EARLIER}"
            )
        if listed.stat().st_size != size:
            raise _damaged(
                path, f"its file {name!r} has {listed.stat().st_size} bytes, saved with {size}"
            )


def _read_format(path: str | os.PathLike) -> dict[str, Any]:
    """The ``format.json`` of a saved buffer, once every file it lists is checked to be there whole.

    Raises:
        FileNotFoundError: if ``path`` holds no saved buffer, or a file of the save is missing.
        ValueError: if ``format.json`` is unreadable or of a newer format version, or a file of
            the save does not have the size it was saved with.
    """
    path = Path(path)
    saved = _parse_format(path)
    if saved["version"] > _FORMAT_VERSION:
        raise ValueError(
            f"the replay buffer at {str(path)!r} was saved in format version "
            f"{saved['version']}, by a newer torchrl-trl-interop; this one reads versions 1 to "
            f"{_FORMAT_VERSION}. Upgrade torchrl-trl-interop to load it."
        )
    _check_saved(path, saved)
    return saved


def is_complete(path: str | os.PathLike) -> bool:
    """Whether ``path`` holds a buffer saved whole by :func:`save_replay_buffer`: its
    ``format.json`` and every file it lists, each of its saved size. A save of a newer format
    version counts as whole (:func:`load_replay_buffer` then says to upgrade)."""
    path = Path(path)
    try:
        saved = _parse_format(path)
        if saved["version"] <= _FORMAT_VERSION:
            _check_saved(path, saved)
    except (OSError, ValueError):
        return False
    return True


def _check_built_alike(replay_buffer: ReplayBuffer, saved: dict[str, Any], path: Path) -> None:
    here = _built(replay_buffer)
    differing = [key for key in sorted(_BUILT_KEYS) if here[key] != saved[key]]
    if differing:
        diffs = ", ".join(f"{key} {here[key]!r} here but {saved[key]!r} saved" for key in differing)
        raise ValueError(
            f"the buffer saved at {str(path)!r} was built as {_describe(saved)}; replay_buffer "
            f"differs: {diffs}. Build the buffer to load into the same way (storage type and "
            "max_size, sampler, writer)."
        )


@boundary("load_replay_buffer")
def load_replay_buffer(replay_buffer: ReplayBuffer, path: str | os.PathLike) -> None:
    """Loads a buffer saved by :func:`save_replay_buffer` into ``replay_buffer``, replacing its content.

    ``replay_buffer`` must be built like the saved one (storage type and size, sampler, writer).

    Raises:
        FileNotFoundError: if ``path`` holds no complete saved buffer (a file of it is missing).
        ValueError: if the save is damaged (an unreadable ``format.json``, a file of another
            size) or of a newer format version, if ``replay_buffer`` is built differently from
            the saved buffer (the message lists the differences), or if torchrl fails to load it.
    """
    check_checkpointable(replay_buffer)
    path = Path(path)
    saved = _read_format(path)
    if "buffer" in saved:
        _check_built_alike(replay_buffer, saved["buffer"], path)
    with _checkpointing(replay_buffer, saved["storage"]):
        try:
            replay_buffer.loads(path / "buffer")
        except Exception as err:
            built = f" (saved as {_describe(saved['buffer'])})" if "buffer" in saved else ""
            raise ValueError(
                f"could not load the buffer saved at {str(path)!r}{built} into this "
                f"{type(replay_buffer).__name__} over {_describe(_built(replay_buffer))}: "
                f"{type(err).__name__}: {err}. The buffer must be built like the saved one; "
                "replay_buffer may now hold part of the save: build it afresh before retrying."
            ) from err
    writer = replay_buffer.writer
    if hasattr(writer, "_commit_log"):  # CommittedWriter: publish the restored length
        writer._commit_log[1] = len(replay_buffer.storage)
