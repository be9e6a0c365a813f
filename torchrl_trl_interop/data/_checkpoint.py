"""Replay buffers saved with the trainer's checkpoints: :class:`BufferCheckpointCallback`.

The buffer goes into each ``checkpoint-N`` directory (``save_replay_buffer``: atomic, text
included) and comes back on resume, with the DataLoader's state when the
DataLoader is stateful; :func:`last_complete_checkpoint` finds the checkpoint to resume from.

This module imports ``transformers`` (the callback's base class); the package imports it only
when one of its names is touched.
"""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path
from typing import Any

import torch
from torchrl.data import ReplayBuffer

from .._checks import boundary, check_bool, signed
from .._upstream._buffers import buffer_writer, write_counters
from ._buffer_files import check_checkpointable, is_complete, load_replay_buffer, save_replay_buffer

try:
    from transformers import TrainerCallback
except ImportError:  # no transformers, no trainer to call it
    TrainerCallback = object

__all__ = [
    "BufferCheckpointCallback",
    "last_complete_checkpoint",
    "load_replay_buffer",
    "save_replay_buffer",
]

_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")


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


class BufferCheckpointCallback(TrainerCallback):
    """A transformers ``TrainerCallback`` that saves a replay buffer with every trainer checkpoint.

    When the trainer is about to save ``output_dir/checkpoint-N``, the buffer is saved into
    ``checkpoint-N/<dirname>`` (``save_replay_buffer``: atomically, by the main process
    only), *before* the trainer writes its own files, so an older checkpoint is never rotated
    away (``save_total_limit``) before the new one holds the buffer. On several ranks the ranks
    then wait for each other (a barrier): every rank's files are in the checkpoint before the
    trainer writes ``trainer_state.json``. Rows written after that save and before the
    trainer's checkpoint (a callback listed after this one that writes in ``on_step_end``) are
    saved too: in ``on_save`` the checkpoint's buffer is replaced, atomically, by one holding
    them, so whatever the order of the callbacks the snapshot holds every row written before
    the checkpoint. When ``trainer.train(
    resume_from_checkpoint=...)`` resumes, the buffer is loaded back in ``on_train_begin``, so
    an online run continues with the buffer as it was at that step.

    The checkpoint resumed from is ``args.output_dir/checkpoint-{state.global_step}`` (the trainer
    has loaded that step's state by then); pass ``resume_from_checkpoint=`` here too when you
    resume from a checkpoint outside ``output_dir``.

    With a stateful DataLoader (``trainer.accelerator.dataloader_config.use_stateful_dataloader
    = True`` before training, needs ``torchdata``; transformers 5.24's ``accelerator_config``
    has no such key) the callback also saves each process's DataLoader ``state_dict``, which
    transformers does not. With ``ignore_data_skip=True`` it loads it back on resume instead
    of letting the trainer skip batches, which repeats and loses rows past the first epoch of a
    dataset without a length (``docs/scale.rst``, "Resuming", has the figures).

    It subclasses ``transformers.TrainerCallback``; the package imports ``transformers`` only
    when this name is touched.

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

    @boundary("BufferCheckpointCallback")
    def __init__(
        self,
        replay_buffer: ReplayBuffer,
        *,
        dirname: str = "replay_buffer",
        resume_from_checkpoint: str | os.PathLike | None = None,
        save_dataloader: bool = True,
    ) -> None:
        check_checkpointable(replay_buffer)
        if not isinstance(dirname, str) or not dirname or os.sep in dirname:
            raise ValueError(
                f"dirname must be a non-empty directory name, got dirname={dirname!r}."
            )
        self.replay_buffer = replay_buffer
        self.dirname = dirname
        self.resume_from_checkpoint = resume_from_checkpoint
        self.save_dataloader = check_bool(save_dataloader, "save_dataloader")
        self._saved_step: int | None = None
        self._saved_rows: tuple = ()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(replay_buffer={type(self.replay_buffer).__name__}(...), "
            f"dirname={self.dirname!r})"
        )

    # -- saving ------------------------------------------------------------------------------

    @staticmethod
    def checkpoint_dir(args: Any, state: Any) -> Path:
        """Where the trainer saves this step's checkpoint (``args.output_dir/checkpoint-N``)."""
        return Path(args.output_dir) / f"checkpoint-{state.global_step}"

    def _written(self) -> tuple:
        """What changes when rows are written: the length and the writer's counters."""
        writer = buffer_writer(self.replay_buffer)
        return (len(self.replay_buffer), *write_counters(writer))

    def _save(self, args: Any, state: Any, train_dataloader: Any) -> None:
        if self._saved_step == state.global_step:
            return
        self._saved_step, self._saved_rows = state.global_step, self._written()
        target = self.checkpoint_dir(args, state)
        if self.save_dataloader and getattr(train_dataloader, "use_stateful_dataloader", False):
            self._save_dataloader(target, train_dataloader)
        if state.is_world_process_zero:
            save_replay_buffer(self.replay_buffer, target / self.dirname)
        _wait_for_every_rank()  # every rank's files are written before the trainer writes its own

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

    @boundary("BufferCheckpointCallback")
    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if control.should_save:  # the trainer saves right after this event
            self._save(args, state, kwargs.get("train_dataloader"))

    @boundary("BufferCheckpointCallback")
    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if control.should_save:
            self._save(args, state, kwargs.get("train_dataloader"))

    @boundary("BufferCheckpointCallback")
    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._saved_step != state.global_step:  # a save not announced above
            self._save(args, state, kwargs.get("train_dataloader"))
        elif self._saved_rows != self._written():
            # rows written after this step's save (a callback listed after this one writes in
            # on_step_end): the checkpoint's buffer is replaced, atomically, by one holding them.
            # The trainer's files are written by now: no barrier (the other ranks save no
            # buffer, and may have seen no write).
            self._saved_rows = self._written()
            if state.is_world_process_zero:
                save_replay_buffer(
                    self.replay_buffer, self.checkpoint_dir(args, state) / self.dirname
                )

    # -- resuming ----------------------------------------------------------------------------

    @boundary("BufferCheckpointCallback")
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._saved_step = None
        if state.global_step == 0:
            return  # a fresh run
        checkpoint = Path(self.resume_from_checkpoint or self.checkpoint_dir(args, state))
        path = checkpoint / self.dirname
        if not is_complete(path):
            complete = last_complete_checkpoint(checkpoint.parent, self.dirname)
            raise FileNotFoundError(
                f"resuming at step {state.global_step}, but {str(checkpoint)!r} holds no "
                "complete replay buffer (its save was interrupted, or it was written without "
                f"this callback). Resume from {complete!r} instead "
                "(last_complete_checkpoint(output_dir)), or pass resume_from_checkpoint= to "
                "the callback if the checkpoint is elsewhere."
            )
        load_replay_buffer(self.replay_buffer, path)
        loader = kwargs.get("train_dataloader")
        if self.save_dataloader and loader is not None:
            self._resume_data(args, checkpoint, loader)

    def _resume_data(self, args: Any, checkpoint: Path, loader: Any) -> None:
        stateful = getattr(loader, "use_stateful_dataloader", False)
        file = self._dataloader_file(checkpoint)
        if stateful and args.ignore_data_skip and file.is_file():
            with open(file, "rb") as handle:
                saved = torch.load(handle, weights_only=False)  # our own file
            _resume_dataloader(loader, saved["state"], saved["epoch"])
        elif stateful and not args.ignore_data_skip:
            warnings.warn(
                signed(
                    "the DataLoader is stateful but ignore_data_skip=False, so the trainer "
                    "resumes by skipping batches, which repeats and loses rows for a dataset "
                    "without a length. Set ignore_data_skip=True to resume from the saved "
                    "DataLoader state (docs/scale.rst, 'Resuming')."
                ),
                stacklevel=2,
            )
        elif args.ignore_data_skip:
            why = "no DataLoader state was saved" if stateful else "the DataLoader is not stateful"
            warnings.warn(
                signed(
                    f"ignore_data_skip=True but {why}: the data restarts from the beginning of an "
                    "epoch. Set trainer.accelerator.dataloader_config.use_stateful_dataloader = "
                    "True before training (docs/scale.rst, 'Resuming')."
                ),
                stacklevel=2,
            )


def _wait_for_every_rank() -> None:
    """A barrier over the trainer's processes (none with one process).

    The trainer writes ``trainer_state.json`` (what makes a checkpoint resumable) and rotates
    old checkpoints away (``save_total_limit``) on the main process right after this callback:
    without the barrier, another rank could still be writing its DataLoader state into the
    checkpoint, or rank 0 its buffer while another rank went on training.
    """
    from accelerate import PartialState

    state = PartialState()
    if state.num_processes > 1:
        state.wait_for_everyone()


def _resume_dataloader(loader: Any, state: dict, epoch: int) -> None:
    """Restores an accelerate DataLoader's state, and the epochs its dataset is given.

    transformers restarts its epoch count at ``global_step // steps_per_epoch``, which for a
    dataset without a length (``max_steps`` set) is 0 however many passes were made; the epochs
    it passes to ``set_epoch`` are shifted so the dataset gets the saved epoch, then the next.
    """
    if state.get("_iterator_finished"):
        epoch += 1  # saved at the end of a pass: the next pass starts afresh
    loader.load_state_dict(state)  # (persistent workers keep the loaded epoch counters)
    set_epoch = loader.set_epoch
    shift: list[int] = []

    def shifted_set_epoch(value: int) -> None:
        if shift and value == loader.iteration:  # accelerate's own call, from __iter__
            return set_epoch(value)
        if not shift:
            shift.append(epoch - value)
        return set_epoch(value + shift[0])

    loader.set_epoch = shifted_set_epoch
