"""A Ray-owned replay buffer as the dataset's source: a Ray task writes, a trainer reads.

One local Ray instance (2 CPUs) serves the whole module. The buffer's actor takes one CPU; the
writer and the "rank" tasks take none, so they all run at once on a 2-core machine.
"""

from __future__ import annotations

import sys
import time
from functools import partial

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, RayReplayBuffer

from torchrl_trl_interop import TorchRLBufferDataset
from torchrl_trl_interop.testing._torchrun import free_port

pytestmark = pytest.mark.slow


def preference_rows(start: int, n: int) -> TensorDict:
    """Rows whose every field is derived from their id, so any corruption is detectable."""
    ids = list(range(start, start + n))
    return TensorDict(
        {
            "row_id": torch.tensor(ids),
            "payload": torch.tensor(ids)[:, None] * 1000 + torch.arange(8),
            "prompt": [f"What is {i} plus {i}?" for i in ids],
            "chosen": [f" It is {2 * i}." for i in ids],
            "rejected": [" I do not know." for _ in ids],
        },
        batch_size=[n],
    )


def is_whole(row: dict) -> bool:
    i = int(row["row_id"])
    payload = torch.as_tensor(row["payload"])
    return (
        bool((payload == i * 1000 + torch.arange(8)).all())
        and row["prompt"] == f"What is {i} plus {i}?"
        and row["chosen"].startswith(f" It is {2 * i}.")
        and row["rejected"].startswith(" I do not know.")
    )


def write(client, start: int, stop: int, chunk: int, pause: float) -> int:
    """A collector stand-in: extends the buffer through its picklable client."""
    for first in range(start, stop, chunk):
        client.extend(preference_rows(first, min(chunk, stop - first)))
        time.sleep(pause)
    return stop


def read_epoch_as_rank(dataset: TorchRLBufferDataset, rank: int, port: int) -> list[int]:
    """One trainer rank: its own process group, its own dataset over the shared buffer."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        return [int(row["row_id"]) for row in dataset]
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ray_tasks():
    import ray
    from ray import cloudpickle

    # Ray workers cannot import this test module: send its functions by value.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    remote = type(
        "Tasks",
        (),
        {
            "write": ray.remote(num_cpus=0)(write),
            "read_epoch_as_rank": ray.remote(num_cpus=0)(read_epoch_as_rank),
        },
    )
    yield remote
    ray.shutdown()
    cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


@pytest.fixture
def ray_buffer(ray_tasks):
    rb = RayReplayBuffer(
        storage=partial(LazyTensorStorage, 1000), batch_size=8, remote_config={"num_cpus": 1}
    )
    yield rb
    rb.close()


def test_trainer_reads_what_a_ray_task_writes(ray_tasks, ray_buffer, tokenizer, tmp_path):
    import ray
    from trl import RewardConfig, RewardTrainer
    from trl.trainer.reward_trainer import DataCollatorForPreference

    from torchrl_trl_interop.testing import toy_reward_model, toy_trainer_args

    rb = ray_buffer
    rb.extend(preference_rows(0, 8))
    total = 400
    writing = ray_tasks.write.remote(rb.client(), 8, total, 8, 0.02)
    deadline = time.monotonic() + 60
    while len(rb) <= 8 and time.monotonic() < deadline:  # the writer's worker is up
        time.sleep(0.05)

    read: list[dict] = []
    inner = DataCollatorForPreference(tokenizer.pad_token_id)

    def collate(examples):
        read.extend(examples)
        return inner(examples)

    trainer = RewardTrainer(
        model=toy_reward_model("llama", tokenizer=tokenizer),
        args=RewardConfig(
            max_length=64,
            remove_unused_columns=False,
            **toy_trainer_args(tmp_path, max_steps=4, per_device_train_batch_size=4, bf16=False),
        ),
        train_dataset=TorchRLBufferDataset(rb, 4, num_batches=None).as_hf_dataset(),
        processing_class=tokenizer,
        data_collator=collate,
    )
    trainer.train()
    assert trainer.state.global_step == 4
    written = ray.get(writing)
    assert written == total == len(rb)

    # Rows read while the task wrote: written ones, whole, and some written after the start.
    assert len(read) >= 16  # 4 steps x 4 rows, plus the batch accelerate fetches ahead
    assert all(0 <= r["row_id"] < total and is_whole(r) for r in read), read
    assert max(r["row_id"] for r in read) >= 8

    # Nothing lost: one epoch over the Ray buffer is exactly the rows written.
    epoch = list(TorchRLBufferDataset(rb, 64, epoch=True))
    assert sorted(int(r["row_id"]) for r in epoch) == list(range(total))
    assert all(is_whole(r) for r in epoch)


def test_ranks_in_ray_tasks_split_an_epoch(ray_tasks, ray_buffer):
    """Two trainer ranks (Ray tasks with a gloo group) read disjoint halves of the shared buffer."""
    import ray

    rb = ray_buffer
    rb.extend(preference_rows(0, 50))
    dataset = TorchRLBufferDataset(rb, 8, epoch=True, shuffle=True, seed=0, keys=["row_id"])
    port = free_port()
    # Pickling the dataset sends the buffer's client (a RayReplayBuffer itself does not pickle).
    parts = ray.get([ray_tasks.read_epoch_as_rank.remote(dataset, r, port) for r in (0, 1)])
    assert not set(parts[0]) & set(parts[1])
    assert sorted(parts[0] + parts[1]) == list(range(50))


def test_ray_buffer_errors(ray_buffer):
    from torch.utils.data import DataLoader

    rb = ray_buffer
    rb.extend(preference_rows(0, 8))
    with pytest.raises(ValueError, match="cannot seed a RayReplayBuffer"):
        TorchRLBufferDataset(rb, 4, seed=0)
    ds = TorchRLBufferDataset(rb, 4, num_batches=None)
    workers = DataLoader(ds, batch_size=4, num_workers=1, multiprocessing_context="spawn")
    with pytest.raises(RuntimeError, match="cannot be read from DataLoader worker processes"):
        next(iter(workers))
    # Sampling goes through the actor's sampler: rows from the buffer, whole.
    assert all(is_whole(r) for r in TorchRLBufferDataset(rb, 4, num_batches=3))
