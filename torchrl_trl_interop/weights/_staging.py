"""The shared-memory staging buffer a :class:`~torchrl_trl_interop.RemotePolicy` pushes into.

The generator process allocates it once, at its start, shaped and typed like its own model's
weights: one flat shared-memory tensor per dtype, a view per weight. The trainer's process gets
the same memory (torch multiprocessing hands it over as file descriptors, once) and a push copies
each weight into its view as :func:`~torchrl_trl_interop.weights._stream.stream_weights` yields
it: one ``copy_`` per tensor, nothing pickled, nothing allocated. The generator then commits the
staged weights between two calls, so a generation never sees half-updated weights: a model on
the CPU has two buffers and its tensors switch to the staged one (:meth:`StagingBuffer.adopt`,
no copy; the other becomes the next push's staging), a model elsewhere (a GPU) copies the
staged weights in (:meth:`StagingBuffer.commit`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

__all__ = ["StagingBuffer"]

#: ``{name: (dtype, offset, shape)}``: where each weight lives in the flat buffers
Slots = dict[str, tuple[torch.dtype, int, tuple[int, ...]]]


class StagingBuffer:
    """Flat shared-memory buffers (one per dtype) with a view per weight name.

    Pickled through a ``torch.multiprocessing`` queue, it arrives in the other process on the same
    memory. Build it with :meth:`like`.

    Examples:
        >>> staging = StagingBuffer.like({"w": torch.zeros(2, 2), "b": torch.zeros(2)})
        >>> staging.fill([("w", torch.ones(2, 2))])
        ['w']
        >>> live = {"w": torch.zeros(2, 2), "b": torch.zeros(2)}
        >>> staging.commit(live, ["w"])
        >>> live["w"].sum().item(), staging.nbytes
        (4.0, 24)
    """

    def __init__(self, buffers: dict[torch.dtype, torch.Tensor], slots: Slots) -> None:
        self.buffers, self.slots = buffers, slots
        self.views = {
            name: buffers[dtype].narrow(0, offset, _numel(shape)).view(shape)
            for name, (dtype, offset, shape) in slots.items()
        }

    @classmethod
    def like(cls, weights: Mapping[str, torch.Tensor], *, shared: bool = True) -> StagingBuffer:
        """A buffer with a slot per tensor of ``weights`` (its shape and dtype), in shared memory
        unless ``shared=False`` (a buffer that Ray's object store carries)."""
        slots: Slots = {}
        sizes: dict[torch.dtype, int] = {}
        for name, tensor in weights.items():
            offset = sizes.get(tensor.dtype, 0)
            slots[name] = (tensor.dtype, offset, tuple(tensor.shape))
            sizes[tensor.dtype] = offset + tensor.numel()
        buffers = {dtype: torch.empty(n, dtype=dtype) for dtype, n in sizes.items()}
        if shared:
            buffers = {dtype: buffer.share_memory_() for dtype, buffer in buffers.items()}
        return cls(buffers, slots)

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers.values())

    def __reduce__(self):
        return StagingBuffer, (self.buffers, self.slots)

    def fill(self, stream: Iterable[tuple[str, torch.Tensor]]) -> list[str]:
        """Copies each ``(name, tensor)`` into its slot as it comes; returns the names filled.

        The names and shapes must have been checked against the slots first
        (:func:`~torchrl_trl_interop.weights._tensors.check_weights_fit`).
        """
        names = []
        with torch.no_grad():
            for name, tensor in stream:
                self.views[name].copy_(tensor)
                names.append(name)
        return names

    def commit(self, live: Mapping[str, torch.Tensor], names: Iterable[str]) -> None:
        """Copies the staged ``names`` into the ``live`` tensors (the generator's model)."""
        with torch.no_grad():
            for name in names:
                live[name].copy_(self.views[name])

    def adopt(
        self,
        live: Mapping[str, torch.Tensor],
        names: Iterable[str] | None = None,
        *,
        current: StagingBuffer | None = None,
    ) -> None:
        """Makes the ``live`` tensors (a CPU model's own) use this buffer's memory (``.data``):
        a commit without a copy. The tensors not among ``names`` (a partial push) are first
        copied here from ``current``, the buffer they use now."""
        with torch.no_grad():
            if current is not None and names is not None:
                for name in set(live) - set(names):
                    self.views[name].copy_(current.views[name])
            for name, tensor in live.items():
                tensor.data = self.views[name]


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for size in shape:
        n *= size
    return n
