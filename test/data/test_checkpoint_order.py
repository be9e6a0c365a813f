"""``BufferCheckpointCallback`` listed before a callback that writes rows in ``on_step_end``
(issue 34): the row written at a save step is in that checkpoint, and a run resumed from it
holds every row."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage

from torchrl_trl_interop import BufferCheckpointCallback
from torchrl_trl_interop.data._checkpoint import load_replay_buffer
from torchrl_trl_interop.testing import toy_buffer, toy_trainer_args


class StepWriter:
    """Writes one row (its id: the step) into the buffer at every ``on_step_end``."""

    def __init__(self, rb):
        self.rb = rb

    def on_step_end(self, args, state, control, **kwargs):
        step = torch.tensor([state.global_step])
        self.rb.extend(TensorDict({"row_id": step}, [1]))

    def __getattr__(self, name):
        if name.startswith("on_"):
            return lambda *a, **k: None
        raise AttributeError(name)


def run(tmp_path, rb, order, resume=None):
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments, default_data_collator

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 1)

        def forward(self, x):
            return {"loss": self.lin(x).pow(2).mean()}

    callbacks = [BufferCheckpointCallback(rb), StepWriter(rb)]
    args = toy_trainer_args(
        str(tmp_path), max_steps=6, save_strategy="steps", save_steps=2, bf16=False
    )
    trainer = Trainer(
        model=Tiny(),
        args=TrainingArguments(**args),
        train_dataset=Dataset.from_dict({"x": [[0.0] * 4] * 64}),
        data_collator=default_data_collator,
        callbacks=callbacks if order == "ours first" else callbacks[::-1],
    )
    trainer.train(resume_from_checkpoint=resume)


@pytest.mark.parametrize("order", ["ours first", "ours last"])
def test_every_row_written_before_the_checkpoint_is_in_it(tmp_path, order):
    rb = toy_buffer(0, storage=LazyTensorStorage(16))
    run(tmp_path, rb, order)
    assert rb[:]["row_id"].tolist() == [1, 2, 3, 4, 5, 6]
    for step in (2, 4, 6):
        saved = toy_buffer(0, storage=LazyTensorStorage(16))
        load_replay_buffer(saved, tmp_path / f"checkpoint-{step}" / "replay_buffer")
        assert saved[:]["row_id"].tolist() == list(range(1, step + 1))
    resumed = toy_buffer(0, storage=LazyTensorStorage(16))
    run(tmp_path, resumed, order, resume=str(tmp_path / "checkpoint-2"))
    assert resumed[:]["row_id"].tolist() == [1, 2, 3, 4, 5, 6]
