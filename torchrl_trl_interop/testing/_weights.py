"""Weight-sync fixtures: a toy Llama with many parameters, a LoRA model, a peak-memory probe."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ._models import toy_causal_lm

#: the sizes of :func:`toy_big_llama`: 12 layers of width 256, about 10M parameters (40 MB fp32)
BIG_LLAMA_SIZES = {
    "hidden_size": 256,
    "intermediate_size": 1024,
    "num_hidden_layers": 12,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
}


def toy_big_llama(seed: int = 0) -> Any:
    """A 12-layer toy Llama of width 256 (about 10M parameters, 40 MB of fp32 weights, 111
    tensors, the largest 1 MB): a model with many parameters, for weight-sync figures.

    Module-level, so ``RemotePolicy(toy_big_llama)`` builds it in its own process.

    Examples:
        >>> model = toy_big_llama()
        >>> round(sum(p.numel() for p in model.parameters()) / 1e6, 1)
        10.0
    """
    return toy_causal_lm(seed=seed, **BIG_LLAMA_SIZES)


def toy_lora_model(model: Any, *, rank: int = 4, seed: int = 1) -> Any:
    """``model`` with a PEFT LoRA adapter on every linear layer, its ``B`` matrices random (not
    zero, as PEFT starts them), so the merged weights differ from the base model's.

    Examples:
        >>> lora = toy_lora_model(toy_causal_lm())
        >>> type(lora).__name__, lora.peft_config["default"].r
        ('PeftModel', 4)
    """
    import torch
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    config = LoraConfig(r=rank, target_modules="all-linear", init_lora_weights=False)
    return get_peft_model(model, config)


def _status_kib(field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+)", Path("/proc/self/status").read_text()).group(1))


@contextlib.contextmanager
def peak_memory_growth() -> Iterator[dict[str, int]]:
    """How far this process's resident memory rose above its level at entry, at its peak.

    Linux: free heap memory is handed back to the kernel (glibc's ``malloc_trim``, so that new
    allocations show), the kernel's high-water mark (``VmHWM``) is reset on entry
    (``/proc/self/clear_refs``) and read on exit; the dict yielded gets ``"bytes"``. Torch's CPU allocations are counted
    (``tracemalloc`` does not see them); memory that was already resident (a staging buffer
    touched before) is not.

    Raises:
        RuntimeError: on another platform than Linux.

    Examples:
        >>> import torch
        >>> with peak_memory_growth() as grown:
        ...     blocks = [torch.ones(250_000) for _ in range(64)]  # 64 MB, written
        ...     del blocks
        >>> grown["bytes"] > 60_000_000
        True
    """
    if not sys.platform.startswith("linux"):
        raise RuntimeError("peak_memory_growth reads /proc/self: it needs Linux.")
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to hand back
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")  # the high-water mark := the current RSS
    before = _status_kib("VmRSS")
    grown: dict[str, int] = {}
    yield grown
    grown["bytes"] = (_status_kib("VmHWM") - before) * 1024
