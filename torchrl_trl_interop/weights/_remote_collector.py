"""A push into a torchrl collector that runs in a Ray actor (``RayLLMCollector``).

torchrl's ``RayLLMCollector`` is a local handle on an ``LLMCollector`` in a Ray actor (read by
:func:`~torchrl_trl_interop._upstream._weights.ray_collector_handle`). Its ``update_policy_weights_`` sends a TensorDict keyed as the *policy's* parameters (a
torchrl LLM wrapper keeps its model under ``"model"``), waits for it without a bound, and the
collector's ``PolicyVersion`` then counts pushes. :func:`push_to_remote_collector` does the
push in the actor itself, in one call (``__ray_call__``): it reads the actor's policy, checks
the weights against it, puts them under ``"model"`` when the policy is a wrapper, applies them
through the collector's own ``update_policy_weights_``, and sets its integer ``PolicyVersion``
to the trainer's step, so rows collected after the push carry that step. The wait is bounded
and an actor's death raises at once.
"""

from __future__ import annotations

from typing import Any

from tensordict import TensorDict, TensorDictBase

from .._checks import signed
from ._staleness import set_policy_version
from ._tensors import Layout, check_weights_fit, policy_model, weights_layout

__all__ = ["PUSH_TIMEOUT_S", "push_to_remote_collector"]

#: how long a push into a collector's Ray actor may wait (it waits for the batch in flight)
PUSH_TIMEOUT_S = 600.0


def _receiver(collector: Any) -> tuple[Layout, bool]:
    """In the actor: the layout of the collector's policy's model, and whether the policy
    keeps it under ``"model"`` (a torchrl LLM wrapper)."""
    policy = collector.policy
    model = policy_model(policy)
    return weights_layout(model), model is not policy


def _apply(collector: Any, weights: TensorDictBase, version: int) -> Any:
    """In the actor: the collector's own weight update, then its version set to ``version``."""
    collector.update_policy_weights_(weights)
    set_policy_version(getattr(collector, "policy_version_tracker", None), version)
    return collector.policy_version


def _get(ref: Any, what: str) -> Any:
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError

    try:
        return ray.get(ref, timeout=PUSH_TIMEOUT_S)
    except GetTimeoutError:
        raise TimeoutError(
            signed(
                f"the collector's Ray actor did not answer {what} within {PUSH_TIMEOUT_S}s (it "
                "finishes the batch in flight first)."
            )
        ) from None
    except RayActorError as error:
        raise RuntimeError(
            signed(f"the collector's Ray actor died during {what}: {error}")
        ) from None


def push_to_remote_collector(
    handle: Any, layout: Layout, stream: Any, version: int, *, partial: bool
) -> Any:
    """Sends the streamed weights to the collector's actor (``handle``) as version ``version``;
    returns the collector's version after the push.

    Raises:
        KeyError: if names differ from the actor's policy model's; nothing is sent.
        ValueError: if shapes differ; nothing is sent.
        RuntimeError: if the actor died.
        TimeoutError: if the actor does not answer within :data:`PUSH_TIMEOUT_S`.
    """
    receiver, wrapped = _get(handle.__ray_call__.remote(_receiver), "its policy's layout")
    check_weights_fit(layout, receiver, receiver_name="policy", partial=partial)
    weights = TensorDict(dict(stream), batch_size=[]).unflatten_keys(".")
    if wrapped:
        weights = TensorDict({"model": weights}, batch_size=[])
    return _get(handle.__ray_call__.remote(_apply, weights, int(version)), "the push")
