"""One training run of the kill-and-resume tests in ``test/test_checkpoint.py``.

Trains a toy model on an epoch-mode view of a replay buffer, with a
:class:`~torchrl_trl_interop.BufferCheckpointCallback`, and appends the ``row_id`` of every row
of every optimizer step to ``ROWS_FILE`` (one line per step, flushed at once). With ``kill_at``
the run SIGKILLs itself at the end of that step; with ``resume`` it resumes from the newest
complete checkpoint. Usage::

    python test/_resume_worker.py '{"view": "iterable", "out": "...", "rows_file": "...", ...}'

A JSON list of such configs runs them one after the other in this process.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import torch
from tensordict import TensorDict
from torchrl.data import LazyStackStorage, LazyTensorStorage, ReplayBuffer

from torchrl_trl_interop import (
    BufferCheckpointCallback,
    TorchRLBufferDataset,
    last_complete_checkpoint,
)
from torchrl_trl_interop.testing import toy_trainer_args


def preference_buffer(n: int) -> ReplayBuffer:
    rb = ReplayBuffer(storage=LazyStackStorage(n))
    rb.extend(
        TensorDict(
            {
                "row_id": torch.arange(n),
                "prompt": [f"What is {i} plus {i}?" for i in range(n)],
                "chosen": [f" It is {2 * i}." for i in range(n)],
                "rejected": [" I do not know." for _ in range(n)],
            },
            batch_size=[n],
        )
    )
    return rb


def vector_buffer(n: int) -> ReplayBuffer:
    rb = ReplayBuffer(storage=LazyTensorStorage(n))
    ids = torch.arange(n)
    rb.extend(TensorDict({"row_id": ids, "x": ids[:, None].float().expand(n, 4)}, [n]))
    return rb


class RecordingCollator:
    """Keeps each row's ``row_id`` in the batch (picklable: DataLoader workers run it)."""

    def __init__(self, inner):
        self.inner = inner

    def __call__(self, examples):
        batch = self.inner(examples)
        batch["row_id"] = torch.tensor([int(e["row_id"]) for e in examples])
        return batch


def recording(trainer_cls, rows_file: str, kill_at: int | None):
    class Recording(trainer_cls):
        def training_step(self, model, inputs, num_items_in_batch=None):
            ids = [int(i) for i in inputs.pop("row_id")]
            with open(rows_file, "a") as file:
                file.write(f"{self.state.global_step + 1} {' '.join(map(str, ids))}\n")
                file.flush()
            return super().training_step(model, inputs, num_items_in_batch)

    class Killer:
        def __getattr__(self, name):
            if name.startswith("on_"):
                return lambda *a, **k: None
            raise AttributeError(name)

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)

    return Recording, Killer()


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)

    def forward(self, x):
        return {"loss": self.lin(x).pow(2).mean()}


def main(cfg: dict) -> None:
    torch.manual_seed(0)
    n, view = cfg["rows"], cfg["view"]
    rb = vector_buffer(n) if view == "torch" else preference_buffer(n)
    ds = TorchRLBufferDataset(rb, 4, epoch=True, shuffle=cfg["shuffle"], seed=0)
    callback = BufferCheckpointCallback(rb)
    common = toy_trainer_args(
        cfg["out"],
        max_steps=cfg["max_steps"],
        per_device_train_batch_size=cfg["batch"],
        remove_unused_columns=False,
        save_strategy="steps",
        save_steps=cfg["save_steps"],
        logging_steps=100,
        dataloader_num_workers=cfg["workers"],
        ignore_data_skip=cfg["ignore_data_skip"],
        save_only_model=False,
        bf16=False,
    )
    if cfg["workers"]:
        common["dataloader_persistent_workers"] = cfg.get("persistent", False)
    if view == "torch":
        from transformers import Trainer, TrainingArguments, default_data_collator

        trainer_cls, killer = recording(Trainer, cfg["rows_file"], cfg.get("kill_at"))
        trainer = trainer_cls(
            model=Tiny(),
            args=TrainingArguments(**common),
            train_dataset=ds,
            data_collator=RecordingCollator(default_data_collator),
            callbacks=[callback, killer],
        )
    else:
        from trl import RewardConfig, RewardTrainer
        from trl.trainer.reward_trainer import DataCollatorForPreference

        from torchrl_trl_interop.testing import toy_reward_model, toy_tokenizer

        tok = toy_tokenizer()
        train = ds.as_hf_dataset() if view == "iterable" else ds.to_hf_dataset()
        # (a map-style dataset is shuffled by the trainer's own sampler, seeded by args.seed)
        trainer_cls, killer = recording(RewardTrainer, cfg["rows_file"], cfg.get("kill_at"))
        trainer = trainer_cls(
            model=toy_reward_model("llama", tokenizer=tok),
            args=RewardConfig(max_length=64, **common),
            train_dataset=train,
            processing_class=tok,
            data_collator=RecordingCollator(DataCollatorForPreference(tok.pad_token_id)),
            callbacks=[callback, killer],
        )
    if cfg["stateful"]:  # transformers' accelerator_config has no use_stateful_dataloader
        trainer.accelerator.dataloader_config.use_stateful_dataloader = True
    resume = last_complete_checkpoint(cfg["out"]) if cfg.get("resume") else None
    trainer.train(resume_from_checkpoint=resume)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    configs = json.loads(sys.argv[1])
    for config in configs if isinstance(configs, list) else [configs]:  # several: one import
        main(config)
