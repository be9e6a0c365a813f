"""Replay buffers checkpointed with the trainer: faithful, atomic, restored on resume; kill and resume."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import pytest
import torch
from _background import background
from packaging.version import Version
from tensordict import TensorDict, lazy_stack, set_list_to_stack
from torchrl.data import (
    LazyStackStorage,
    LazyTensorStorage,
    ListStorage,
    ReplayBuffer,
    SamplerWithoutReplacement,
)
from torchrl.data.llm import History

from torchrl_trl_interop import (
    BufferCheckpointCallback,
    CommittedWriter,
    TorchRLBufferDataset,
    last_complete_checkpoint,
)
from torchrl_trl_interop.data._buffer_files import is_complete
from torchrl_trl_interop.data._checkpoint import load_replay_buffer, save_replay_buffer
from torchrl_trl_interop.testing import toy_buffer

ROOT = Path(__file__).resolve().parents[2]


def text_rows(n: int, *, ragged: bool, start: int = 0):
    rows = []
    for i in range(start, start + n):
        with set_list_to_stack(True):
            chat = [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a" * i}]
            history = History.from_chats([chat])[0]
        ids = torch.arange(i % 5 + 1) if ragged else torch.full((3,), i)
        rows.append(
            TensorDict({"ids": ids, "row": torch.tensor(i), "prompt": f"p{i}", "h": history})
        )
    return lazy_stack(rows) if ragged else torch.stack(rows)


STORAGES = {
    "LazyTensorStorage": (lambda: LazyTensorStorage(6), False),
    "LazyStackStorage": (lambda: LazyStackStorage(6), True),
    "ListStorage": (lambda: ListStorage(6), True),
}


def empty(capacity: int, n: int = 0) -> ReplayBuffer:
    return toy_buffer(n, storage=LazyTensorStorage(capacity))


def stored(rb) -> list[str]:
    """Each stored row, its columns in name order (a restored row may hold them in another)."""
    return [repr(dict(sorted(row.items()))) for row in TorchRLBufferDataset(rb, 4).iter_storage()]


def full_buffer(name: str):
    make, ragged = STORAGES[name]
    rb = ReplayBuffer(storage=make(), sampler=SamplerWithoutReplacement())
    rb.extend(text_rows(6, ragged=ragged))
    rb.extend(text_rows(2, ragged=ragged, start=6))  # wraps: slots 0 and 1 hold rows 6 and 7
    rb.sample(2)  # the sampler is half-way through its epoch
    return rb


class TestSaveLoad:
    @pytest.mark.parametrize("name", list(STORAGES))
    def test_text_history_cursor_and_sampler_come_back(self, name, tmp_path):
        rb = full_buffer(name)
        save_replay_buffer(rb, tmp_path / "rb")
        make, ragged = STORAGES[name]
        restored = ReplayBuffer(storage=make(), sampler=SamplerWithoutReplacement())
        restored.extend(text_rows(3, ragged=ragged, start=50))  # replaced, not merged
        load_replay_buffer(restored, tmp_path / "rb")
        assert stored(restored) == stored(rb)
        assert [r["prompt"] for r in TorchRLBufferDataset(restored, 4).iter_storage()] == [
            "p6", "p7", "p2", "p3", "p4", "p5"
        ]  # fmt: skip
        assert restored.writer._cursor == rb.writer._cursor == 2
        assert restored.writer._write_count == rb.writer._write_count == 8
        assert torch.equal(restored.sampler._sample_list, rb.sampler._sample_list)

    def test_torchrl_dumps_alone_and_strings(self, tmp_path):
        """Why text storages are saved as rows: under tensordict 0.14 (torchrl 0.14.1's pin,
        ``tensordict<0.15``) ``ReplayBuffer.dumps/loads`` restores every string as row 0's;
        tensordict 0.15 fixed it. Asserted per version, so a move to 0.15 shows here."""
        rb = full_buffer("LazyTensorStorage")
        rb.dumps(tmp_path / "raw")
        restored = ReplayBuffer(storage=LazyTensorStorage(6))
        restored.loads(tmp_path / "raw")
        prompts = rb[:]["prompt"]
        if Version(metadata.version("tensordict")) < Version("0.15"):
            assert restored[:]["prompt"] == [prompts[0]] * len(prompts) != prompts
        else:
            assert restored[:]["prompt"] == prompts

    def test_tensor_only_storage_uses_torchrl_format(self, tmp_path):
        save_replay_buffer(toy_buffer(5), tmp_path / "rb")
        assert json.loads((tmp_path / "rb" / "format.json").read_text())["storage"] == "torchrl"
        restored = empty(5)
        load_replay_buffer(restored, tmp_path / "rb")
        assert restored[:]["x"].tolist() == [0, 1, 2, 3, 4]

    def test_committed_writer_publishes_the_restored_length(self, tmp_path):
        rb = toy_buffer(5, writer=CommittedWriter())
        save_replay_buffer(rb, tmp_path / "rb")
        restored = toy_buffer(0, storage=LazyTensorStorage(5), writer=CommittedWriter())
        load_replay_buffer(restored, tmp_path / "rb")
        assert restored.writer.committed == (0, 5)

    def test_resave_replaces(self, tmp_path):
        save_replay_buffer(empty(5, 3), tmp_path / "rb")
        save_replay_buffer(toy_buffer(5), tmp_path / "rb")
        restored = empty(5)
        load_replay_buffer(restored, tmp_path / "rb")
        assert len(restored) == 5
        assert os.listdir(tmp_path) == ["rb"]  # no temporary or old directory left behind


class TestDamagedSaves:
    """Regression (issue 20, item 5): a save missing a file loaded as rows without columns."""

    def saved(self, tmp_path) -> Path:
        path = save_replay_buffer(toy_buffer(5), tmp_path / "checkpoint-1" / "rb")
        assert (path / "buffer" / "storage" / "x.memmap").is_file()
        (tmp_path / "checkpoint-1" / "trainer_state.json").write_text("{}")
        assert last_complete_checkpoint(tmp_path, "rb") == str(tmp_path / "checkpoint-1")
        return path

    def test_a_missing_column_file_is_refused(self, tmp_path):
        path = self.saved(tmp_path)
        (path / "buffer" / "storage" / "x.memmap").unlink()
        assert not is_complete(path)
        assert last_complete_checkpoint(tmp_path, "rb") is None
        restored = empty(5)
        with pytest.raises(FileNotFoundError, match=r"damaged: its file 'buffer/storage/x.memmap'"):
            load_replay_buffer(restored, path)
        assert len(restored) == 0  # nothing loaded

    @pytest.mark.parametrize("name", ["buffer/storage/x.memmap", "buffer/writer/metadata.json"])
    def test_a_file_of_another_size_is_refused(self, tmp_path, name):
        path = self.saved(tmp_path)
        with open(path / name, "ab") as file:
            file.write(b"\0")
        assert not is_complete(path)
        with pytest.raises(ValueError, match=rf"damaged: its file '{name}' has \d+ bytes, saved"):
            load_replay_buffer(empty(5), path)

    def test_every_file_of_the_save_is_listed(self, tmp_path):
        path = self.saved(tmp_path)
        listed = json.loads((path / "format.json").read_text())["files"]
        on_disk = {p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()} - {
            "format.json"
        }
        assert set(listed) == on_disk and "buffer/storage/x.memmap" in listed


class TestSavePathsNotOurs:
    """Regression (issue 20, item 6): a save over a user's file replaced it with a buffer and left
    the file as a hidden ``.<name>.old-<pid>-<tid>``."""

    def test_a_regular_file_is_left_alone(self, tmp_path):
        (tmp_path / "notes.txt").write_text("mine")
        with pytest.raises(NotADirectoryError, match=r"notes.txt' exists and is not a directory"):
            save_replay_buffer(toy_buffer(3), tmp_path / "notes.txt")
        assert (tmp_path / "notes.txt").read_text() == "mine"
        assert os.listdir(tmp_path) == ["notes.txt"]  # no hidden copy, no temporary directory

    def test_a_directory_of_other_files_is_left_alone(self, tmp_path):
        (tmp_path / "rb").mkdir()
        (tmp_path / "rb" / "data.csv").write_text("1,2")
        with pytest.raises(FileExistsError, match=r"holding \['data.csv'\], not a replay buffer"):
            save_replay_buffer(toy_buffer(3), tmp_path / "rb")
        assert os.listdir(tmp_path / "rb") == ["data.csv"]
        assert os.listdir(tmp_path) == ["rb"]

    def test_a_symbolic_link_is_left_alone(self, tmp_path):
        save_replay_buffer(toy_buffer(3), tmp_path / "real")
        (tmp_path / "link").symlink_to(tmp_path / "real")
        with pytest.raises(FileExistsError, match="is a symbolic link"):
            save_replay_buffer(toy_buffer(5), tmp_path / "link")
        assert sorted(os.listdir(tmp_path)) == ["link", "real"]

    def test_an_empty_directory_or_an_earlier_save_is_replaced(self, tmp_path):
        (tmp_path / "rb").mkdir()
        save_replay_buffer(empty(5, 3), tmp_path / "rb")
        save_replay_buffer(toy_buffer(5), tmp_path / "rb")
        restored = empty(5)
        load_replay_buffer(restored, tmp_path / "rb")
        assert restored[:]["x"].tolist() == [0, 1, 2, 3, 4]


class TestLoadingIntoAnotherBuffer:
    """Regression (issue 20, item 16): loading into a buffer built differently, or a corrupt or
    newer ``format.json``, raised raw torch/torchrl/json errors or loaded silently."""

    @pytest.mark.parametrize(
        ("target", "match"),
        [
            (lambda: empty(10), r"max_size 10 here but 5 saved"),
            (
                lambda: toy_buffer(0, storage=LazyStackStorage(5)),
                r"storage 'LazyStackStorage' here but 'LazyTensorStorage' saved",
            ),
            (
                lambda: toy_buffer(
                    0, storage=LazyTensorStorage(5), sampler=SamplerWithoutReplacement()
                ),
                r"sampler 'SamplerWithoutReplacement' here but 'RandomSampler' saved",
            ),
            (
                lambda: toy_buffer(0, storage=LazyTensorStorage(5), writer=CommittedWriter()),
                r"writer 'CommittedWriter' here but 'RoundRobinWriter' saved",
            ),
        ],
    )
    def test_the_difference_is_named(self, tmp_path, target, match):
        save_replay_buffer(toy_buffer(5), tmp_path / "rb")
        with pytest.raises(
            ValueError,
            match=rf"saved at '.*rb' was built as LazyTensorStorage\(max_size=5\).*{match}",
        ):
            load_replay_buffer(target(), tmp_path / "rb")

    def test_text_rows_into_a_smaller_storage(self, tmp_path):
        rb = full_buffer("LazyStackStorage")
        save_replay_buffer(rb, tmp_path / "rb")
        with pytest.raises(ValueError, match=r"max_size 3 here but 6 saved"):
            load_replay_buffer(ReplayBuffer(storage=LazyStackStorage(3)), tmp_path / "rb")

    @pytest.mark.parametrize(
        ("content", "match"),
        [
            ("{not json", r"damaged: format.json cannot be read"),
            ('["a list"]', r"damaged: format.json holds no format version"),
            ('{"version": 2, "storage": "rows"}', r"damaged: format.json lacks its file list"),
            ('{"version": 2, "storage": "zip", "files": {}}', r"names no storage format"),
        ],
    )
    def test_a_corrupt_format_file_is_named(self, tmp_path, content, match):
        save_replay_buffer(toy_buffer(5), tmp_path / "rb")
        (tmp_path / "rb" / "format.json").write_text(content)
        assert not is_complete(tmp_path / "rb")
        with pytest.raises(ValueError, match=r"saved at '.*rb' is damaged.*Resume from an earlier"):
            load_replay_buffer(empty(5), tmp_path / "rb")
        with pytest.raises(ValueError, match=match):
            load_replay_buffer(empty(5), tmp_path / "rb")

    def test_a_newer_format_version_is_refused(self, tmp_path):
        save_replay_buffer(toy_buffer(5), tmp_path / "rb")
        saved = json.loads((tmp_path / "rb" / "format.json").read_text())
        (tmp_path / "rb" / "format.json").write_text(json.dumps({**saved, "version": 99}))
        assert is_complete(tmp_path / "rb")  # whole as far as we know: loading says why not
        restored = empty(5)
        with pytest.raises(ValueError, match=r"format version 99, by a newer torchrl-trl-interop"):
            load_replay_buffer(restored, tmp_path / "rb")
        assert len(restored) == 0

    def test_a_version_1_save_still_loads(self, tmp_path):
        """Saves written before files and builds were recorded load as before."""
        save_replay_buffer(toy_buffer(5), tmp_path / "rb")
        (tmp_path / "rb" / "format.json").write_text('{"version": 1, "storage": "torchrl"}')
        assert is_complete(tmp_path / "rb")
        restored = empty(5)
        load_replay_buffer(restored, tmp_path / "rb")
        assert restored[:]["x"].tolist() == [0, 1, 2, 3, 4]
        # into another build: torchrl's error, with the save and both builds named
        with pytest.raises(
            ValueError,
            match=r"could not load the buffer saved at '.*rb' into this "
            r"ReplayBuffer over LazyTensorStorage\(max_size=10\).*RuntimeError",
        ):
            load_replay_buffer(empty(10), tmp_path / "rb")


class TestCrashWhileSaving:
    def test_failed_write_leaves_the_previous_save(self, tmp_path, monkeypatch):
        save_replay_buffer(empty(5, 3), tmp_path / "rb")
        rb = toy_buffer(5)

        def fail(path):
            raise OSError("disk full")

        monkeypatch.setattr(rb.writer, "dumps", fail)  # storage and sampler written, then fails
        with pytest.raises(OSError, match="disk full"):
            save_replay_buffer(rb, tmp_path / "rb")
        restored = empty(5)
        load_replay_buffer(restored, tmp_path / "rb")
        assert restored[:]["x"].tolist() == [0, 1, 2]
        assert os.listdir(tmp_path) == ["rb"]

    @pytest.mark.parametrize("where", ["writer", "fsync"])
    def test_sigkill_mid_write(self, killed_mid_write, where):
        """A process SIGKILLed while saving checkpoint-2's buffer: checkpoint-1's still loads."""
        returncode, output, tmp_path = killed_mid_write[where]
        assert returncode == -9, output[-2000:]
        assert not (tmp_path / "checkpoint-2" / "rb").exists()
        leftovers = os.listdir(tmp_path / "checkpoint-2")
        assert len(leftovers) == 1 and leftovers[0].startswith(".rb.tmp-")  # only the temp dir
        with pytest.raises(FileNotFoundError, match="no saved replay buffer"):
            load_replay_buffer(empty(5), tmp_path / "checkpoint-2" / "rb")
        restored = empty(5)
        load_replay_buffer(restored, tmp_path / "checkpoint-1" / "rb")
        assert restored[:]["x"].tolist() == [0, 1, 2]
        for step in (1, 2):
            (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
        assert last_complete_checkpoint(tmp_path, "rb") == str(tmp_path / "checkpoint-1")


@background(timeout_s=300)
def killed_mid_write(job):
    """Per place (the writer's dump, the final fsync): a process that saves checkpoint-1's
    buffer, then SIGKILLs itself there while saving checkpoint-2's; its exit code, output and
    folder. Both processes run at once."""
    procs = {}
    for where in ("writer", "fsync"):
        folder = job.folder / where
        script = textwrap.dedent(
            f"""
            import os, signal
            import torchrl_trl_interop.data._buffer_files as ckpt
            from torchrl_trl_interop.testing import toy_buffer
            from torchrl.data import LazyTensorStorage
            ckpt.save_replay_buffer(toy_buffer(3, storage=LazyTensorStorage(5)), {str(folder / "checkpoint-1" / "rb")!r})
            rb = toy_buffer(5, storage=LazyTensorStorage(5))
            die = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
            if {where!r} == "writer":
                rb.writer.dumps = die
            else:
                ckpt._fsync_tree = die
            ckpt.save_replay_buffer(rb, {str(folder / "checkpoint-2" / "rb")!r})
            """
        )
        procs[where] = job.popen([sys.executable, "-c", script], log=f"{where}.log", cwd=ROOT)
    codes = job.wait(*procs.values())
    return {
        where: (code, job.log(f"{where}.log"), job.folder / where)
        for where, code in zip(procs, codes)
    }


class TestCallbackArguments:
    def test_ray_and_non_buffers_are_refused(self):
        with pytest.raises(TypeError, match="replay_buffer must be a torchrl ReplayBuffer"):
            BufferCheckpointCallback([1, 2])

    def test_dirname(self):
        with pytest.raises(ValueError, match="dirname must be a non-empty directory name"):
            BufferCheckpointCallback(toy_buffer(2), dirname="a/b")

    def test_is_a_trainer_callback_by_protocol(self):
        callback = BufferCheckpointCallback(toy_buffer(2))
        assert callback.on_log(None, None, None, logs={}) is None
        with pytest.raises(AttributeError, match="no attribute 'state'"):
            callback.state  # noqa: B018  (not an ExportableState)

    def test_resume_without_a_saved_buffer_names_the_last_complete_checkpoint(self, tmp_path):
        args = type("Args", (), {"output_dir": str(tmp_path), "ignore_data_skip": False})
        state = type("State", (), {"global_step": 4, "is_world_process_zero": True})
        for step in (2, 4):
            (tmp_path / f"checkpoint-{step}").mkdir()
            (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
        save_replay_buffer(toy_buffer(2), tmp_path / "checkpoint-2" / "replay_buffer")
        with pytest.raises(FileNotFoundError, match=r"Resume from '.*checkpoint-2'"):
            BufferCheckpointCallback(toy_buffer(2)).on_train_begin(args, state, None)

    def test_a_resume_error_is_signed_by_the_callback(self, tmp_path):
        """The trainer calls the callback, which loads the buffer: its error names the callback."""
        args = type("Args", (), {"output_dir": str(tmp_path), "ignore_data_skip": False})
        state = type("State", (), {"global_step": 2, "is_world_process_zero": True})
        (tmp_path / "checkpoint-2").mkdir()
        save_replay_buffer(toy_buffer(2), tmp_path / "checkpoint-2" / "replay_buffer")
        callback = BufferCheckpointCallback(toy_buffer(0, storage=LazyTensorStorage(3)))
        match = r"^BufferCheckpointCallback: the buffer saved at .* max_size 3 here but 2 saved"
        with pytest.raises(ValueError, match=match):
            callback.on_train_begin(args, state, None)

    @pytest.mark.parametrize(
        ("stateful", "ignore_data_skip", "match"),
        [
            (True, False, "resumes by skipping batches"),
            (False, True, "the DataLoader is not stateful"),
        ],
    )
    def test_resume_settings_that_cannot_restore_the_data_position_warn(
        self, tmp_path, stateful, ignore_data_skip, match
    ):
        args = type("Args", (), {"output_dir": str(tmp_path), "ignore_data_skip": ignore_data_skip})
        state = type("State", (), {"global_step": 2, "is_world_process_zero": True})
        loader = type("Loader", (), {"use_stateful_dataloader": stateful})()
        save_replay_buffer(toy_buffer(2), tmp_path / "checkpoint-2" / "replay_buffer")
        rb = empty(2)
        with pytest.warns(UserWarning, match=match):
            BufferCheckpointCallback(rb).on_train_begin(args, state, None, train_dataloader=loader)
        assert rb[:]["x"].tolist() == [0, 1]  # the buffer is restored all the same


# -- kill and resume: a subprocess trains, SIGKILLs itself, a second one resumes -------------------

ROWS, BATCH, MAX_STEPS, SAVE_STEPS = 12, 2, 15, 4  # 6 steps an epoch, 2.5 epochs
#: The settings under which each view resumes exactly (docs/scale.rst, "Resuming").
EXACT = {
    "torch": {"view": "torch", "stateful": True, "ignore_data_skip": True},
    "as_hf_dataset": {"view": "iterable", "stateful": True, "ignore_data_skip": True},
    "to_hf_dataset": {"view": "map", "stateful": False, "ignore_data_skip": False},
    # 2 spawn workers, kept across epochs (each advances its own epoch); RewardTrainer cannot
    # send an iterable view to spawn workers (a lambda of its _prepare_dataset does not pickle)
    "torch-2-workers": {
        "view": "torch",
        "stateful": True,
        "ignore_data_skip": True,
        "workers": 2,
        "persistent": True,
    },
}


def config(case: str, tmp: Path, run: str, **extra) -> dict:
    return {
        "rows": ROWS,
        "batch": BATCH,
        "max_steps": MAX_STEPS,
        "save_steps": SAVE_STEPS,
        "shuffle": True,
        "workers": 0,
        **EXACT[case],
        "out": str(tmp / case / run),
        "rows_file": str(tmp / case / f"{run}.txt"),
        **extra,
    }


def start(job, configs, log: str) -> subprocess.Popen:
    """``_resume_worker.py`` running ``configs`` (one or a list), its output written to ``log``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRL_EXPERIMENTAL_SILENCE": "1"}
    worker = str(Path(__file__).with_name("_resume_worker.py"))
    return job.popen([sys.executable, worker, json.dumps(configs)], log=log, cwd=ROOT, env=env)


def steps(path: str) -> dict[int, list[int]]:
    lines = (line.split() for line in Path(path).read_text().splitlines())
    return {int(step): [int(i) for i in ids] for step, *ids in lines}


@background(timeout_s=570)  # ~50 s alone; longer in the background of a busy machine
def kill_and_resume(job):
    """Every case killed at a random step in the second epoch or later, each in its own
    process, beside one process running every case uninterrupted (all at once: they share the
    cores); then one process resumes every killed case. Per case: the step killed at, and the
    rows of each step of the killed, resumed and uninterrupted runs."""
    tmp = job.folder
    for case in EXACT:
        (tmp / case).mkdir()
    kill_at = {case: random.randint(7, MAX_STEPS - 1) for case in EXACT}
    reference = [config(case, tmp, "u") for case in EXACT]
    killed = {case: config(case, tmp, "run", kill_at=kill_at[case]) for case in EXACT}
    resumed = {
        case: dict(cfg, kill_at=None, resume=True, rows_file=str(tmp / case / "r.txt"))
        for case, cfg in killed.items()
    }
    first = [(reference, "reference.log", 0)]
    first += [(cfg, f"{case}/killed.log", -9) for case, cfg in killed.items()]
    procs = [start(job, cfg, log) for cfg, log, _ in first]
    for code, (_, log, expect) in zip(job.wait(*procs), first):
        assert code == expect, job.log(log)[-4000:]
    (code,) = job.wait(start(job, list(resumed.values()), "resumed.log"))
    assert code == 0, job.log("resumed.log")[-4000:]
    return {
        case: (
            kill_at[case],
            steps(killed[case]["rows_file"]),
            steps(resumed[case]["rows_file"]),
            steps(cfg["rows_file"]),
        )
        for case, cfg in zip(EXACT, reference)
    }


@pytest.mark.slow
@pytest.mark.parametrize("case", list(EXACT))
def test_kill_and_resume_is_exact(case, kill_and_resume):
    kill_at, before, after, reference = kill_and_resume[case]
    checkpoint = min(after) - 1
    # killed in on_step_end, before the trainer saves that step: a kill at a save step leaves
    # that checkpoint without its trainer state, and the run resumes from the one before
    assert checkpoint == (kill_at - 1) // SAVE_STEPS * SAVE_STEPS, (kill_at, checkpoint)
    assert max(before) == kill_at and max(after) == MAX_STEPS
    # what the trainer learned from: the killed run up to its checkpoint, then the resumed run
    trained = [before[s] for s in range(1, checkpoint + 1)] + [after[s] for s in sorted(after)]
    assert trained == [reference[s] for s in range(1, MAX_STEPS + 1)], f"killed at {kill_at}"
    rows = [i for batch in trained for i in batch]
    epochs = [rows[i : i + ROWS] for i in range(0, len(rows) - ROWS + 1, ROWS)]
    assert len(epochs) == 2 and all(sorted(e) == list(range(ROWS)) for e in epochs)
    assert epochs[0] != epochs[1]  # shuffled afresh each epoch


# -- an online run: a writer thread extends the buffer while the trainer samples it --------------


class OnlineWriter:
    """A collector thread writing 3 rows per trainer step; a callback hands it each step's number."""

    def __init__(self, rb: ReplayBuffer):
        import queue
        import threading

        self.rb, self.todo, self.done = rb, queue.Queue(), queue.Queue()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while (step := self.todo.get()) is not None:
            ids = torch.arange(3) + 100 * step
            self.rb.extend(TensorDict({"row_id": ids, "x": ids[:, None].float().expand(3, 4)}, [3]))
            self.done.put(step)

    def on_step_begin(self, args, state, control, **kwargs):
        self.todo.put(state.global_step + 1)
        self.done.get(timeout=60)

    def on_train_end(self, args, state, control, **kwargs):
        self.todo.put(None)

    def __getattr__(self, name):
        if name.startswith("on_"):
            return lambda *a, **k: None
        raise AttributeError(name)


def buffer_state(rb: ReplayBuffer) -> tuple:
    return rb[:]["row_id"].tolist(), rb.writer._cursor, rb.writer._write_count


def online_run(tmp_path: Path, resume: str | None, snapshots: dict) -> ReplayBuffer:
    from transformers import Trainer, TrainingArguments, default_data_collator

    from torchrl_trl_interop.testing import toy_trainer_args

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 1)

        def forward(self, x, row_id=None):
            return {"loss": self.lin(x).pow(2).mean()}

    class Snapshot:
        def on_train_begin(self, args, state, control, **kwargs):
            snapshots[("begin", state.global_step)] = buffer_state(rb)

        def on_step_end(self, args, state, control, **kwargs):
            snapshots[("end", state.global_step)] = buffer_state(rb)

        def __getattr__(self, name):
            if name.startswith("on_"):
                return lambda *a, **k: None
            raise AttributeError(name)

    rb = toy_buffer(0, storage=LazyTensorStorage(10))
    rb.extend(TensorDict({"row_id": torch.arange(3), "x": torch.zeros(3, 4)}, [3]))
    ds = TorchRLBufferDataset(rb, 2, num_batches=None, seed=0)  # online: sampled as it grows
    args = toy_trainer_args(
        str(tmp_path),
        max_steps=6,
        save_strategy="steps",
        save_steps=3,
        dataloader_num_workers=0,
        bf16=False,
    )
    callbacks = [BufferCheckpointCallback(rb), OnlineWriter(rb), Snapshot()]
    trainer = Trainer(
        model=Tiny(),
        args=TrainingArguments(**args),
        train_dataset=ds,
        data_collator=default_data_collator,
        callbacks=callbacks,
    )
    trainer.train(resume_from_checkpoint=resume)
    return rb


@pytest.mark.slow
def test_online_run_resumes_with_the_buffer_as_it_was(tmp_path):
    first: dict = {}
    uninterrupted = online_run(tmp_path, None, first)
    assert len(uninterrupted) == 10 and uninterrupted.writer._write_count == 21  # wrapped
    second: dict = {}
    resumed = online_run(tmp_path, str(tmp_path / "checkpoint-3"), second)
    # the resumed run starts from the buffer as saved at step 3, not from its fresh 3 rows
    assert second[("begin", 3)] == first[("end", 3)]
    assert second[("end", 4)] == first[("end", 4)]
    assert buffer_state(resumed) == buffer_state(uninterrupted)
