"""One rank of ``test_stream.py``'s 2-rank run: a toy Llama sharded with FSDP2 (``fully_shard``,
gloo on CPU) pushed by ``WeightSyncCallback``; every rank gathers and copies into its own model.

Writes ``rank<r>.json`` into the folder given as the first argument: the peak extra memory of
a streamed push and of the whole model gathered at once, and whether the rank's receiver ends
with the unsharded model's checksum (a module is each rank's own receiver: every rank pushes).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist

from torchrl_trl_interop import WeightSyncCallback, weights_checksum
from torchrl_trl_interop.testing import peak_memory_growth, toy_big_llama
from torchrl_trl_interop.weights._tensors import model_weights


def main(out: Path) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = toy_big_llama(seed=1)  # the same weights on both ranks before sharding
    expected = weights_checksum(model)
    sizes = [p.numel() * p.element_size() for p in model.parameters()]
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    sharded = all(hasattr(p, "full_tensor") for p in model.parameters())
    receiver = toy_big_llama(seed=0)
    callback = WeightSyncCallback(receiver)
    state = SimpleNamespace(is_world_process_zero=rank == 0)
    callback.push(model, 0, state)  # first use: lazy initialisations out of the measurement
    with peak_memory_growth() as streamed:
        callback.push(model, 1, state)
    with peak_memory_growth() as whole:
        weights = model_weights(model)  # every parameter gathered at once
    del weights
    result = {
        "sharded": sharded,
        "streamed": streamed["bytes"],
        "whole": whole["bytes"],
        "model": sum(sizes),
        "largest": max(sizes),
        "synced": weights_checksum(receiver) == expected,
    }
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main(Path(sys.argv[1]))
