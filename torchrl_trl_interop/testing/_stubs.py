"""Stand-ins for measuring the reward wrapper: a host-sync counter and a stub reward model."""

from __future__ import annotations

from typing import Any


def count_host_syncs() -> Any:
    """A context whose ``.count`` is the number of tensor reads back to the host inside it.

    Counts every call that must wait for a tensor's values (on a GPU, a device sync):
    ``item``, ``tolist``, ``bool``/``int``/``float``/index conversions, ``torch.equal``,
    ``nonzero`` and the other ops whose output size depends on the values. ``.calls`` names them.

    Examples:
        >>> import torch
        >>> x = torch.tensor([1, 2, 3])
        >>> with count_host_syncs() as syncs:
        ...     y = x * 2
        ...     total = int(y.sum())
        >>> syncs.count, syncs.calls
        (1, ['__int__'])
    """
    from torch.overrides import TorchFunctionMode

    reads = {
        "item",
        "tolist",
        "__bool__",
        "__int__",
        "__float__",
        "__index__",
        "equal",
        "allclose",
        "nonzero",
        "masked_select",
        "unique",
        "numpy",
    }

    class HostSyncCounter(TorchFunctionMode):
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[str] = []

        @property
        def count(self) -> int:
            return len(self.calls)

        def __torch_function__(self, func, types, args=(), kwargs=None):
            name = getattr(func, "__name__", "")
            if name in reads:
                self.calls.append(name)
            return func(*args, **(kwargs or {}))

    return HostSyncCounter()


def stub_reward_model(
    vocab_size: int = 384, *, pad_token_id: int | None = 0, eos_token_id: int | None = 2
) -> Any:
    """A reward "model" that costs next to nothing, to measure what a wrapper adds around it.

    Pools as HF sequence classifiers do (the rightmost token whose id is not
    ``config.pad_token_id``) and returns that token's learned score, ``[N, 1]``; it reads no
    value back to the host.

    Examples:
        >>> import torch
        >>> model = stub_reward_model()
        >>> model(input_ids=torch.tensor([[5, 6, 0], [7, 8, 9]])).shape
        torch.Size([2, 1])
    """
    from types import SimpleNamespace

    import torch
    from torch import nn

    class StubRewardModel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config = SimpleNamespace(
                pad_token_id=pad_token_id, eos_token_id=eos_token_id, num_labels=1
            )
            self.score = nn.Embedding(vocab_size, 1)

        def forward(self, input_ids: torch.Tensor, attention_mask: Any = None) -> torch.Tensor:
            positions = torch.arange(input_ids.shape[-1], device=input_ids.device)
            pad = self.config.pad_token_id
            real = input_ids != pad if pad is not None else torch.ones_like(input_ids).bool()
            last = (positions * real).argmax(-1)
            rows = torch.arange(input_ids.shape[0], device=input_ids.device)
            return self.score(input_ids[rows, last])

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return StubRewardModel().eval()
