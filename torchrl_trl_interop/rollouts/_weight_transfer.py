"""TRL's ``AsyncGRPOTrainer`` weight-transfer seam onto a TorchRL policy.

:class:`TorchRLWeightTransfer` implements ``WeightTransferProtocol``
(``trl.experimental.async_grpo``): the ``(name, tensor)`` stream the trainer sends becomes a
TensorDict, pushed with the package's one weight push (``weights._push``), as
:class:`~torchrl_trl_interop.WeightSyncCallback` pushes.
"""

from __future__ import annotations

from typing import Any

from tensordict import TensorDict

from .._checks import boundary
from ..weights._push import push, target_kind
from ._async_grpo import TorchRLRolloutWorker

__all__ = ["TorchRLWeightTransfer"]


class TorchRLWeightTransfer:
    """TRL's ``WeightTransferProtocol`` onto a TorchRL policy.

    ``send_weights`` gathers the ``(name, tensor)`` pairs TRL streams (Hugging Face parameter
    names, frozen ones left out) into a TensorDict and pushes it to the target as
    :class:`~torchrl_trl_interop.WeightSyncCallback` does, with the number of transfers so far
    (TRL's ``model_version``) as the version, into any target of
    :class:`~torchrl_trl_interop.WeightSyncCallback`'s table of targets (a torchrl
    ``WeightSyncScheme``, a ``RemotePolicy`` or ``RayRemotePolicy``, a torchrl collector, or a
    module copied in place). Names or shapes that do not fit the receiving model raise before
    anything is sent.
    With ``worker=``, ``pause``/``resume`` hold the worker's lock, so no batch is collected or
    scored while the weights change.

    Args:
        target: any target of :class:`~torchrl_trl_interop.WeightSyncCallback` (its table).

    Keyword Args:
        worker (TorchRLRolloutWorker, optional): the worker collecting with ``target``.

    Attributes:
        version (int): transfers done (TRL bumps ``model_version`` once after each).
        sent_names (list of str): the names of the last transfer.

    Examples:
        >>> import torch
        >>> model = torch.nn.Linear(2, 2)
        >>> transfer = TorchRLWeightTransfer(model)
        >>> transfer.init_weight_transfer(); transfer.pause()
        >>> transfer.send_weights(iter([("weight", torch.ones(2, 2))]))
        >>> transfer.resume(); transfer.destroy()
        >>> model.weight.tolist(), transfer.version
        ([[1.0, 1.0], [1.0, 1.0]], 1)
    """

    @boundary("TorchRLWeightTransfer")
    def __init__(self, target: Any, *, worker: TorchRLRolloutWorker | None = None) -> None:
        target_kind(target)  # a target that cannot receive weights raises here
        self.target = target
        self.worker = worker
        self.version = 0
        self.sent_names: list[str] = []
        self._paused = False

    def __repr__(self) -> str:
        return f"TorchRLWeightTransfer(target={type(self.target).__name__}, version={self.version})"

    def init_weight_transfer(self) -> None:
        """Nothing to set up: torchrl's schemes connect on the first send."""

    def pause(self) -> None:
        if self.worker is not None and not self._paused:
            self.worker.lock.acquire()
        self._paused = True

    @boundary("TorchRLWeightTransfer")
    def send_weights(self, iterator: Any) -> None:
        named = [(name, tensor.detach()) for name, tensor in iterator]
        self.sent_names = [name for name, _ in named]
        weights = TensorDict(dict(named), batch_size=[]).unflatten_keys(".")
        push(self.target, weights, self.version + 1, partial=True)
        self.version += 1

    def resume(self) -> None:
        if self.worker is not None and self._paused:
            self.worker.lock.release()
        self._paused = False

    def destroy(self) -> None:
        self.resume()
