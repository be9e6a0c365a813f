"""TRL's ``AsyncGRPOTrainer`` weight-transfer seam onto a TorchRL policy.

:class:`TorchRLWeightTransfer` implements ``WeightTransferProtocol``
(``trl.experimental.async_grpo``): the ``(name, tensor)`` stream the trainer sends becomes a
TensorDict that torchrl's ``WeightStrategy`` applies to the policy's model, or that a
:class:`~torchrl_trl_interop.RemotePolicy` receives through torchrl's multiprocess scheme.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict

from ._async_grpo import TorchRLRolloutWorker

__all__ = ["TorchRLWeightTransfer"]


def _policy_model(target: Any) -> Any:
    """The module whose parameters carry the HF names TRL streams (``model.layers.0...``)."""
    from ..weights._sync import policy_model

    return policy_model(getattr(target, "policy", target))  # a collector's policy, or itself


class TorchRLWeightTransfer:
    """TRL's ``WeightTransferProtocol`` onto a TorchRL policy.

    ``send_weights`` gathers the ``(name, tensor)`` pairs TRL streams (Hugging Face parameter
    names, frozen ones left out) into a TensorDict and hands it to the target: a
    :class:`~torchrl_trl_interop.RemotePolicy` (torchrl's multiprocess scheme; the version is the
    number of transfers so far, TRL's ``model_version``), or, in this process, the weights are
    copied in place into a torchrl LLM wrapper's model (a collector's policy, a
    ``TransformersWrapper``, an ``nn.Module``) with torchrl's ``WeightStrategy``.
    With ``worker=``, ``pause``/``resume`` hold the worker's lock, so no batch is collected or
    scored while the weights change.

    Args:
        target: a ``RemotePolicy``, a torchrl collector, a torchrl LLM wrapper or an ``nn.Module``.

    Keyword Args:
        worker (TorchRLRolloutWorker, optional): the worker collecting with ``target``.

    Attributes:
        version (int): transfers done (TRL bumps ``model_version`` once after each).
        sent_names (list of str): the names of the last transfer.

    Examples:
        >>> model = torch.nn.Linear(2, 2)
        >>> transfer = TorchRLWeightTransfer(model)
        >>> transfer.init_weight_transfer(); transfer.pause()
        >>> transfer.send_weights(iter([("weight", torch.ones(2, 2))]))
        >>> transfer.resume(); transfer.destroy()
        >>> model.weight.tolist(), transfer.version
        ([[1.0, 1.0], [1.0, 1.0]], 1)
    """

    def __init__(self, target: Any, *, worker: TorchRLRolloutWorker | None = None) -> None:
        from ..weights._remote_policy import RemotePolicy

        self.remote = isinstance(target, RemotePolicy)
        if not self.remote and not isinstance(_policy_model(target), torch.nn.Module):
            raise TypeError(
                f"TorchRLWeightTransfer: target={type(target).__name__} holds no module to "
                "receive weights; pass a RemotePolicy, a collector, a torchrl LLM wrapper or "
                "an nn.Module."
            )
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

    def send_weights(self, iterator: Any) -> None:
        named = [(name, tensor.detach()) for name, tensor in iterator]
        self.sent_names = [name for name, _ in named]
        weights = TensorDict(dict(named), batch_size=[]).unflatten_keys(".")
        if self.remote:
            self.target.update_policy_weights_(weights, policy_version=self.version + 1)
        else:
            from ..weights._sync import copy_weights_into

            copy_weights_into(getattr(self.target, "policy", self.target), weights)
        self.version += 1

    def resume(self) -> None:
        if self.worker is not None and self._paused:
            self.worker.lock.release()
        self._paused = False

    def destroy(self) -> None:
        self.resume()
