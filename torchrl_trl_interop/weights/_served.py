"""What :class:`~torchrl_trl_interop.RemotePolicy` and :class:`~torchrl_trl_interop.RayRemotePolicy`
share: a torchrl LLM policy built elsewhere by ``policy_factory``, called like the policy, whose
weights a :class:`~torchrl_trl_interop.weights._scheme.StagingWeightSyncScheme` pushes.

:class:`ServedPolicy` holds the factory, the timeout, the policy version and the scheme, and
the push (:meth:`ServedPolicy.update_policy_weights_`); each subclass brings where the policy
runs: a channel for the scheme (``_channel``), how the generators start and stop, and the call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase

from .._checks import check_real, speaking_for, type_error
from ._scheme import StagingWeightSyncScheme

__all__ = ["ServedPolicy", "check_rows", "check_timeout"]


def check_timeout(value: Any) -> float:
    """``value`` as seconds if it is a finite number ``> 0``.

    Raises:
        TypeError: if ``value`` is not a real number.
        ValueError: if it is not finite and positive.

    Examples:
        >>> check_timeout(-5)
        Traceback (most recent call last):
        ...
        ValueError: timeout must be a finite number of seconds > 0, got timeout=-5.0; it bounds every wait on the generators (their start, a call, a push).
    """
    seconds = check_real(value, "timeout", finite=False)
    if not 0 < seconds < float("inf"):
        raise ValueError(
            f"timeout must be a finite number of seconds > 0, got timeout={seconds!r}; it "
            "bounds every wait on the generators (their start, a call, a push)."
        )
    return seconds


def check_rows(tensordict: Any) -> None:
    """Raises a :class:`ValueError` for a TensorDict with no row (a batch dimension of 0)."""
    if isinstance(tensordict, TensorDictBase) and 0 in tuple(tensordict.batch_size):
        raise ValueError(
            f"the TensorDict has no row (batch_size={list(tensordict.batch_size)}); call the "
            "policy with at least one row."
        )


class ServedPolicy(TensorDictModuleBase):
    """A torchrl LLM policy served elsewhere (a process, Ray actors), with weight sync.

    The generators start at the first :meth:`update_policy_weights_`; every push goes through
    :attr:`weight_sync_scheme`, checked against the generators' names and shapes first.

    Args:
        policy_factory (Callable[[], TensorDictModuleBase]): builds the policy where it runs; it
            must pickle (a module-level function or a ``functools.partial``).

    Keyword Args:
        timeout (float): seconds to wait for a call, a push or the start.
        num_threads (int, optional): ``torch.set_num_threads`` where the policy runs.

    Attributes:
        policy_version (int or None): the version last committed where the policy runs.
        weight_sync_scheme (StagingWeightSyncScheme): the sender side of the push (the one
            :func:`~torchrl_trl_interop.weights._push.push` sends through).
    """

    #: where ``policy_factory`` builds the policy (the error for a factory that is not callable)
    builds_in = "the process that serves it"
    #: what an instance holds that cannot be pickled
    holds = "the generators"
    #: the attributes its repr shows between the factory and whether it started
    repr_fields: tuple[str, ...] = ()
    #: whether the same object built on several trainer ranks is one set of generators (pushed
    #: from rank 0 only), or each rank's own (each rank pushes its own)
    shared_by_ranks = False

    def __init__(
        self, policy_factory: Callable[[], Any], *, timeout: float, num_threads: int | None
    ) -> None:
        super().__init__()
        if not callable(policy_factory):
            expected = f"a callable that builds the policy in {self.builds_in}"
            raise type_error("policy_factory", expected, policy_factory)
        self.policy_factory = policy_factory
        self.timeout = check_timeout(timeout)
        self.num_threads = num_threads
        self.in_keys: list = []
        self.out_keys: list = []
        self.policy_version: int | None = None
        self._finalizer: Any = None
        self.weight_sync_scheme = self._new_scheme()

    def _channel(self) -> Any:
        """The scheme's channel (see ``_scheme``): how a push reaches the generators."""
        raise NotImplementedError

    def _new_scheme(self) -> StagingWeightSyncScheme:
        scheme = StagingWeightSyncScheme(timeout=self.timeout)
        scheme.init_on_sender(model_id="policy", channel=self._channel())
        return scheme

    @property
    def started(self) -> bool:
        """Whether the generators run (they start with the first weights)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        factory = getattr(self.policy_factory, "__name__", type(self.policy_factory).__name__)
        fields = [f"{name}={getattr(self, name)!r}" for name in self.repr_fields]
        fields = [f"policy_factory={factory}", *fields, f"started={self.started}"]
        return f"{type(self).__name__}({', '.join(fields)}, policy_version={self.policy_version})"

    def update_policy_weights_(
        self,
        weights: torch.nn.Module | TensorDictBase | dict[str, torch.Tensor],
        *,
        policy_version: int,
        partial: bool = False,
    ) -> None:
        """Sends ``weights`` to the generators and makes them live as ``policy_version``.

        The first call starts the generators. A model is streamed one tensor at a time
        (:func:`~torchrl_trl_interop.weights._stream.stream_weights`: sharded parameters gathered
        one by one, LoRA merged, or a PEFT adapter alone when the generators hold the same PEFT
        model) to the generators (a shared-memory staging buffer, Ray's object store); each
        generator commits it between two calls.

        Args:
            weights (nn.Module, TensorDictBase or dict): the trainer's model, its
                ``TensorDict.from_module`` weights or its ``state_dict()`` (keys as the
                generators' model).

        Keyword Args:
            policy_version (int): the version rows sampled from now on are stamped with (an
                int ``>= 0``: the optimizer step whose weights these are).
            partial (bool, optional): ``weights`` may hold a subset of the generators' tensors
                (TRL streams trainable parameters only); the others keep their values.
                Defaults to ``False``.

        Raises:
            TypeError: if ``weights`` is none of those, or ``policy_version`` is not an int.
            KeyError: if names differ from the generators' model's (e.g. a ``torch.compile`` or
                PEFT prefix); nothing is sent.
            ValueError: if shapes differ from the generators' model's (nothing is sent), or
                ``policy_version`` is negative.
            RuntimeError: if a generator died (the message says which, and why if known).
            TimeoutError: if a generator does not commit within ``timeout``.
        """
        with speaking_for(type(self).__name__):
            self.weight_sync_scheme.send(weights, policy_version=policy_version, partial=partial)

    def close(self) -> None:
        """Stops the generators (also done when this object is garbage-collected); the next
        push starts new ones."""
        if self._finalizer is not None:
            self._finalizer()
        self._stopped()
        self.weight_sync_scheme = self._new_scheme()

    def _stopped(self) -> None:
        """Forgets the generators :meth:`close` stopped."""
        raise NotImplementedError

    def __getstate__(self):
        raise TypeError(
            f"{type(self).__name__} holds {self.holds} and cannot be pickled; build one in each "
            "process that calls it."
        )
