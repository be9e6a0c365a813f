"""One rank of the 2-process ``torchrun`` test in ``test/test_scale.py`` (gloo, CPU).

Every rank builds the same replay buffer, then runs each scenario below and records the
``row_id`` of every row it consumed. ``test_scale.py`` checks that the ranks' rows are disjoint
and together cover the epoch. Usage::

    torchrun --nproc_per_node=2 test/_torchrun_worker.py OUT_DIR [SCENARIO ...]
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from tensordict import TensorDict
from torch.utils.data import DataLoader
from torchrl.data import LazyStackStorage, LazyTensorStorage, ReplayBuffer

from torchrl_trl_interop import TorchRLBufferDataset
from torchrl_trl_interop.testing import toy_trainer_args

ROWS = 8  # 2 ranks x 2 steps x 2 rows per device: one epoch
STEPS = 2
PER_DEVICE = 2


def preference_buffer() -> ReplayBuffer:
    ids = torch.arange(ROWS)
    rb = ReplayBuffer(storage=LazyStackStorage(ROWS))
    rb.extend(
        TensorDict(
            {
                "row_id": ids,
                "prompt": [f"What is {i} plus {i}?" for i in range(ROWS)],
                "chosen": [f" It is {2 * i}." for i in range(ROWS)],
                "rejected": [" I do not know." for _ in range(ROWS)],
            },
            batch_size=[ROWS],
        )
    )
    return rb


def vector_buffer() -> ReplayBuffer:
    rb = ReplayBuffer(storage=LazyTensorStorage(ROWS))
    ids = torch.arange(ROWS)
    rb.extend(TensorDict({"row_id": ids, "x": ids[:, None].float().expand(ROWS, 4)}, [ROWS]))
    return rb


def ddp_loop(out: dict) -> None:
    """A hand-written DDP loop: a plain DataLoader with 2 spawn workers on each rank."""
    ds = TorchRLBufferDataset(vector_buffer(), 2, epoch=True, shuffle=True, seed=0)
    loader = DataLoader(
        ds, batch_size=2, num_workers=2, multiprocessing_context="spawn", persistent_workers=False
    )
    out["ddp_loop"] = [int(i) for batch in loader for i in batch["row_id"]]


def _recording_collator(inner):
    def collate(examples):
        batch = inner(examples)
        batch["row_id"] = torch.tensor([int(e["row_id"]) for e in examples])
        return batch

    return collate


def _recording(trainer_cls):
    class Recording(trainer_cls):
        seen: list[int]

        def training_step(self, model, inputs, num_items_in_batch=None):
            loader = self.callback_handler.train_dataloader
            self.loader = f"{type(loader).__name__}({type(loader.dataset).__name__})"
            self.seen.extend(int(i) for i in inputs.pop("row_id"))
            return super().training_step(model, inputs, num_items_in_batch)

    return Recording


def common_args(tmp: str) -> dict:
    return toy_trainer_args(
        tmp,
        max_steps=STEPS,
        per_device_train_batch_size=PER_DEVICE,
        remove_unused_columns=False,
        bf16=False,
    )


def reward_trainer(out: dict, name: str, view: str, tmp: str, **config) -> None:
    from trl import RewardConfig, RewardTrainer
    from trl.trainer.reward_trainer import DataCollatorForPreference

    from torchrl_trl_interop.testing import toy_reward_model, toy_tokenizer

    tok = toy_tokenizer()
    epoch = view == "as_hf_dataset"
    ds = TorchRLBufferDataset(preference_buffer(), 4, epoch=epoch)
    train = getattr(ds, view)()
    trainer = _recording(RewardTrainer)(
        model=toy_reward_model("llama", tokenizer=tok),
        args=RewardConfig(max_length=64, **common_args(tmp), **config),
        train_dataset=train,
        processing_class=tok,
        data_collator=_recording_collator(DataCollatorForPreference(tok.pad_token_id)),
    )
    trainer.seen = []
    trainer.train()
    assert trainer.state.global_step == STEPS, trainer.state.global_step
    out[name] = trainer.seen
    out["_loaders"][name] = trainer.loader


def torch_trainer(out: dict, name: str, tmp: str, **config) -> None:
    """transformers.Trainer given the torch dataset itself (default split_by_rank=None)."""
    from transformers import Trainer, TrainingArguments, default_data_collator

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 1)

        def forward(self, x):
            return {"loss": self.lin(x).pow(2).mean()}

    ds = TorchRLBufferDataset(vector_buffer(), 2, epoch=True, shuffle=True, seed=0)
    trainer = _recording(Trainer)(
        model=Tiny(),
        args=TrainingArguments(**common_args(tmp), **config),
        train_dataset=ds,
        data_collator=_recording_collator(default_data_collator),
    )
    trainer.seen = []
    trainer.train()
    assert trainer.state.global_step == STEPS, trainer.state.global_step
    out[name] = trainer.seen
    out["_loaders"][name] = trainer.loader


def main() -> None:
    out_dir = Path(sys.argv[1])
    scenarios = sys.argv[2:] or [
        "ddp_loop",
        "reward_map",
        "reward_iterable",
        "torch_trainer_dispatch",
        "torch_trainer_shard",
    ]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    tmp = str(out_dir / f"trainer_rank{rank}")
    out: dict = {"_loaders": {}}
    timings: dict = {}
    for name in scenarios:  # ddp_loop first: it must run before accelerate is initialized
        start = time.perf_counter()
        if name == "ddp_loop":
            ddp_loop(out)
        elif name == "reward_map":
            reward_trainer(out, name, "to_hf_dataset", tmp)
        elif name == "reward_iterable":  # RewardTrainer forces dispatch_batches=False here
            reward_trainer(out, name, "as_hf_dataset", tmp)
        elif name == "torch_trainer_dispatch":
            torch_trainer(out, name, tmp)
        elif name == "torch_trainer_shard":
            torch_trainer(out, name, tmp, accelerator_config={"dispatch_batches": False})
        else:
            raise ValueError(f"unknown scenario {name!r}")
        timings[name] = round(time.perf_counter() - start, 2)
    out["_timings"] = timings
    out["_world_size"] = dist.get_world_size()
    (out_dir / f"rank{rank}.json").write_text(json.dumps(out))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
