"""Replay buffers saved with the trainer's checkpoints: :class:`BufferCheckpointCallback`.

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
import re
import shutil
import tempfile
import threading
from contextlib import nullcontext
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

from ._utils import _is_leaf
from .workers import is_remote

__all__ = [
    "BufferCheckpointCallback",
    "last_complete_checkpoint",
    "load_replay_buffer",
    "save_replay_buffer",
]

_FORMAT_FILE = "format.json"
_FORMAT_VERSION = 1
_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")


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
        lock = getattr(replay_buffer, "_replay_lock", None) or nullcontext()
        with lock:
            fmt = _storage_format(replay_buffer)
            storage = replay_buffer.storage
            own = storage.checkpointer
            if fmt == "rows":
                storage.checkpointer = _RowsCheckpointer()
            try:
                replay_buffer.dumps(tmp / "buffer")
            finally:
                storage.checkpointer = own
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
    lock = getattr(replay_buffer, "_replay_lock", None) or nullcontext()
    with lock:
        storage = replay_buffer.storage
        own = storage.checkpointer
        if fmt == "rows":
            storage.checkpointer = _RowsCheckpointer()
        try:
            replay_buffer.loads(path / "buffer")
        finally:
            storage.checkpointer = own
    writer = replay_buffer.writer
    if hasattr(writer, "_commit_log"):  # CommittedWriter: publish the restored length
        writer._commit_log[1] = len(replay_buffer.storage)


def last_complete_checkpoint(
    output_dir: str | os.PathLike, dirname: str = "replay_buffer"
) -> str | None:
    """The newest ``output_dir/checkpoint-N`` holding both the trainer's state and a whole buffer.

    transformers' ``resume_from_checkpoint=True`` takes the highest-numbered checkpoint directory,
    even one whose saving a crash interrupted; pass this one instead.

    Examples:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     print(last_complete_checkpoint(tmp))
        None
    """
    root = Path(output_dir)
    if not root.is_dir():
        return None
    steps = []
    for child in root.iterdir():
        match = _CHECKPOINT_RE.match(child.name)
        if match and (child / "trainer_state.json").is_file() and is_complete(child / dirname):
            steps.append((int(match.group(1)), child))
    return str(max(steps)[1]) if steps else None


def _noop(*args: Any, **kwargs: Any) -> None:
    return None


class BufferCheckpointCallback:
    """A transformers ``TrainerCallback`` that saves a replay buffer with every trainer checkpoint.

    When the trainer is about to save ``output_dir/checkpoint-N``, the buffer is saved into
    ``checkpoint-N/<dirname>`` (:func:`save_replay_buffer`: atomically, by the main process
    only), *before* the trainer writes its own files, so an older checkpoint is never rotated
    away (``save_total_limit``) before the new one holds the buffer. When ``trainer.train(
    resume_from_checkpoint=...)`` resumes, the buffer is loaded back in ``on_train_begin``, so
    an online run continues with the buffer as it was at that step.

    The checkpoint resumed from is ``args.output_dir/checkpoint-{state.global_step}`` (the trainer
    has loaded that step's state by then); pass ``resume_from_checkpoint=`` here too when you
    resume from a checkpoint outside ``output_dir``.

    With ``accelerator_config={"use_stateful_dataloader": True}`` (needs ``torchdata``) the
    callback also saves each process's DataLoader ``state_dict`` (transformers does not), and
    with ``ignore_data_skip=True`` loads it back on resume instead of letting the trainer skip
    batches (``docs/scale.rst``, "Resuming", says which views this makes exact).

    It is a ``TrainerCallback`` by protocol (every ``on_*`` event), not by inheritance, so
    that ``torchrl_trl_interop`` imports without ``transformers``.

    Args:
        replay_buffer (ReplayBuffer): the buffer to save and restore (any local torchrl buffer;
            text columns are saved faithfully).

    Keyword Args:
        dirname (str, optional): its directory inside each checkpoint. Defaults to
            ``"replay_buffer"``.
        resume_from_checkpoint (str, optional): the checkpoint to load the buffer from on
            resume. Defaults to ``None`` (the one of the resumed step, under ``output_dir``).
        save_dataloader (bool, optional): save and restore the DataLoader state as above.
            Defaults to ``True``.

    Raises:
        TypeError: for a Ray buffer or something that is not a ``ReplayBuffer``.

    Examples:
        >>> from torchrl_trl_interop.testing import toy_buffer
        >>> callback = BufferCheckpointCallback(toy_buffer(4))
        >>> callback  # doctest: +ELLIPSIS
        BufferCheckpointCallback(replay_buffer=ReplayBuffer(...), dirname='replay_buffer')

        Give it to a trainer: ``RewardTrainer(..., callbacks=[callback])``, then resume with
        ``trainer.train(resume_from_checkpoint=last_complete_checkpoint(output_dir))``.
    """

    def __init__(
        self,
        replay_buffer: ReplayBuffer,
        *,
        dirname: str = "replay_buffer",
        resume_from_checkpoint: str | os.PathLike | None = None,
        save_dataloader: bool = True,
    ) -> None:
        check_checkpointable(replay_buffer, "BufferCheckpointCallback")
        if not isinstance(dirname, str) or not dirname or os.sep in dirname:
            raise ValueError(
                f"BufferCheckpointCallback: dirname must be a non-empty directory name, got "
                f"dirname={dirname!r}."
            )
        if not isinstance(save_dataloader, bool):
            raise TypeError(
                f"BufferCheckpointCallback: save_dataloader must be a bool, got {save_dataloader!r}."
            )
        self.replay_buffer = replay_buffer
        self.dirname = dirname
        self.resume_from_checkpoint = resume_from_checkpoint
        self.save_dataloader = save_dataloader
        self._saved_step: int | None = None

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(replay_buffer={type(self.replay_buffer).__name__}(...), "
            f"dirname={self.dirname!r})"
        )

    def __getattr__(self, name: str) -> Any:
        if name.startswith("on_"):  # every other TrainerCallback event: nothing to do
            return _noop
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # -- saving ------------------------------------------------------------------------------

    @staticmethod
    def checkpoint_dir(args: Any, state: Any) -> Path:
        """Where the trainer saves this step's checkpoint (``args.output_dir/checkpoint-N``)."""
        return Path(args.output_dir) / f"checkpoint-{state.global_step}"

    def _save(self, args: Any, state: Any, train_dataloader: Any) -> None:
        if self._saved_step == state.global_step:
            return
        self._saved_step = state.global_step
        target = self.checkpoint_dir(args, state)
        if self.save_dataloader and getattr(train_dataloader, "use_stateful_dataloader", False):
            self._save_dataloader(target, train_dataloader)
        if state.is_world_process_zero:
            save_replay_buffer(self.replay_buffer, target / self.dirname)

    def _dataloader_file(self, checkpoint: Path) -> Path:
        from accelerate import PartialState

        return checkpoint / f"{self.dirname}.dataloader_rank{PartialState().process_index}.pt"

    def _save_dataloader(self, checkpoint: Path, train_dataloader: Any) -> None:
        checkpoint.mkdir(parents=True, exist_ok=True)
        file = self._dataloader_file(checkpoint)
        tmp = file.with_name(f".{file.name}.tmp-{os.getpid()}")
        # ``iteration``: the epoch accelerate gave the dataset (transformers counts the epochs
        # of a dataset without a length from 0 again on resume)
        saved = {"state": train_dataloader.state_dict(), "epoch": train_dataloader.iteration}
        with open(tmp, "wb") as handle:
            torch.save(saved, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, file)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if control.should_save:  # the trainer saves right after this event
            self._save(args, state, kwargs.get("train_dataloader"))

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if control.should_save:
            self._save(args, state, kwargs.get("train_dataloader"))

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._save(args, state, kwargs.get("train_dataloader"))  # saves not announced above

    # -- resuming ----------------------------------------------------------------------------

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._saved_step = None
        if state.global_step == 0:
            return  # a fresh run
        checkpoint = Path(self.resume_from_checkpoint or self.checkpoint_dir(args, state))
        path = checkpoint / self.dirname
        if not is_complete(path):
            complete = last_complete_checkpoint(checkpoint.parent, self.dirname)
            raise FileNotFoundError(
                f"BufferCheckpointCallback: resuming at step {state.global_step}, but "
                f"{str(checkpoint)!r} holds no complete replay buffer (its save was interrupted, "
                f"or it was written without this callback). Resume from "
                f"{complete!r} instead (last_complete_checkpoint(output_dir)), or pass "
                "resume_from_checkpoint= to the callback if the checkpoint is elsewhere."
            )
        load_replay_buffer(self.replay_buffer, path)
        loader = kwargs.get("train_dataloader")
        if self.save_dataloader and args.ignore_data_skip and loader is not None:
            file = self._dataloader_file(checkpoint)
            if file.is_file() and getattr(loader, "use_stateful_dataloader", False):
                with open(file, "rb") as handle:
                    saved = torch.load(handle, weights_only=False)  # our own file
                _resume_dataloader(loader, saved["state"], saved["epoch"])


def _resume_dataloader(loader: Any, state: dict, epoch: int) -> None:
    """Restores an accelerate DataLoader's state, and the epochs its dataset is given.

    transformers restarts its epoch count at ``global_step // steps_per_epoch``, which for a
    dataset without a length (``max_steps`` set) is 0 however many passes were made; the epochs
    it passes to ``set_epoch`` are shifted so the dataset gets the saved epoch, then the next.
    """
    if state.get("_iterator_finished"):
        epoch += 1  # saved at the end of a pass: the next pass starts afresh
    else:
        loader.load_state_dict(state)
    set_epoch = loader.set_epoch
    shift: list[int] = []

    def shifted_set_epoch(value: int) -> None:
        if shift and value == loader.iteration:  # accelerate's own call, from __iter__
            return set_epoch(value)
        if not shift:
            shift.append(epoch - value)
        return set_epoch(value + shift[0])

    loader.set_epoch = shifted_set_epoch
