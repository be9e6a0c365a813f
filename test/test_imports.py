"""The package imports without transformers/trl/datasets, and says which extra to install."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
from _background import background

import torchrl_trl_interop

HEAVY = ("transformers", "trl", "datasets")
# names whose module defines a ``transformers.TrainerCallback`` subclass: touching one imports
# transformers (issue 19, item 3); every other name stays light
CALLBACK_MODULE_NAMES = (
    "WeightSyncCallback",
    "BufferCheckpointCallback",
    "last_complete_checkpoint",
)


def run(job, name: str, code: str) -> tuple[int, str, str]:
    """``code`` run by a fresh interpreter, in the background (``_background.py``): its exit
    code, stdout and stderr."""
    command = [sys.executable, "-c", textwrap.dedent(code)]
    (returncode,) = job.wait(job.popen(command, log=f"{name}.out", err=f"{name}.err"))
    return returncode, job.log(f"{name}.out"), job.log(f"{name}.err")


#: one interpreter, stage after stage (each only adds imports), reporting what it holds after
#: each: the three checks below share its start-up (torch, tensordict, torchrl: seconds)
STAGES = f"""
import json, sys
def report(stage):
    heavy = [m for m in {HEAVY!r} if m in sys.modules]
    checkpoint = "torchrl_trl_interop.data._checkpoint" in sys.modules
    print(json.dumps({{"stage": stage, "heavy": heavy, "checkpoint": checkpoint}}), flush=True)
import torchrl_trl_interop as pkg
report("package")
pkg.TorchRLBufferDataset
report("dataset")
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer
rb = ReplayBuffer(storage=LazyTensorStorage(4))
rb.extend(TensorDict({{"x": torch.arange(4)}}, batch_size=[4]))
ds = pkg.TorchRLBufferDataset(rb, 2)
list(ds)
report("iterated")
for name in pkg.__all__:
    if name not in {CALLBACK_MODULE_NAMES!r}:
        getattr(pkg, name)
report("every light name")
ds.to_hf_dataset()
report("to_hf_dataset")
"""


@background(timeout_s=300)
def stages(job) -> dict[str, dict]:
    returncode, stdout, stderr = run(job, "stages", STAGES)
    assert returncode == 0, stderr
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    return {stage["stage"]: stage for stage in map(json.loads, lines)}


def test_every_public_name_is_lazy_and_light(stages):
    assert stages["package"]["heavy"] == [], "heavy import at package import"
    assert stages["every light name"]["heavy"] == [], "touching the public names imported them"


def test_the_dataset_leaves_transformers_out(stages):
    """Touching TorchRLBufferDataset does not import a callback module, hence no transformers."""
    assert "transformers" not in stages["dataset"]["heavy"]
    assert not stages["dataset"]["checkpoint"]


def test_features_import_hf_only_when_used(stages):
    assert "datasets" not in stages["iterated"]["heavy"]
    assert "datasets" in stages["to_hf_dataset"]["heavy"]


def test_callbacks_are_trainer_callbacks(tmp_path):
    """``isinstance(cb, TrainerCallback)`` and ``trainer.pop_callback(cls)`` work (issue 19)."""
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from torchrl_trl_interop import BufferCheckpointCallback, WeightSyncCallback
    from torchrl_trl_interop.testing import toy_buffer, toy_causal_lm, toy_trainer_args

    sync = WeightSyncCallback(torch.nn.Linear(2, 2))
    checkpoint = BufferCheckpointCallback(toy_buffer(4))
    assert isinstance(sync, TrainerCallback) and isinstance(checkpoint, TrainerCallback)
    trainer = Trainer(
        model=toy_causal_lm(),
        args=TrainingArguments(**toy_trainer_args(tmp_path, bf16=False)),
        callbacks=[sync, checkpoint],
    )
    assert trainer.pop_callback(WeightSyncCallback) is sync
    assert trainer.pop_callback(BufferCheckpointCallback) is checkpoint
    kinds = [type(cb) for cb in trainer.callback_handler.callbacks]
    assert WeightSyncCallback not in kinds and BufferCheckpointCallback not in kinds


@background(timeout_s=300)
def blocked_import(job) -> tuple[int, str, str]:
    """The package imported and used with transformers, trl and datasets blocked."""
    return run(
        job,
        "blocked",
        f"""
        import sys
        for name in {HEAVY!r}:
            sys.modules[name] = None  # makes `import name` raise ImportError
        import importlib.util
        real_find_spec = importlib.util.find_spec
        importlib.util.find_spec = lambda n, *a: None if n.split(".")[0] in {HEAVY!r} else real_find_spec(n, *a)
        import torch
        from tensordict import TensorDict
        from torchrl.data import LazyTensorStorage, ReplayBuffer
        import torchrl_trl_interop as pkg
        for name in pkg.__all__:
            getattr(pkg, name)
        rb = ReplayBuffer(storage=LazyTensorStorage(4))
        rb.extend(TensorDict({{"x": torch.arange(4)}}, batch_size=[4]))
        ds = pkg.TorchRLBufferDataset(rb, 2)
        assert len(list(ds)) == 2
        try:
            ds.to_hf_dataset()
        except ImportError as err:
            assert "pip install torchrl-trl-interop[hf]" in str(err), err
            print("ok")
        """,
    )


def test_import_with_optional_packages_blocked(blocked_import):
    returncode, stdout, stderr = blocked_import
    assert returncode == 0, stderr
    assert stdout.strip().splitlines()[-1] == "ok"


def test_dir_and_all():
    assert set(torchrl_trl_interop.__all__) <= set(dir(torchrl_trl_interop))
    assert "TorchRLBufferDataset" in torchrl_trl_interop.__all__
    assert "HFRewardModelWrapper" in torchrl_trl_interop.__all__


def test_unknown_name():
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        torchrl_trl_interop.Nope  # noqa: B018
