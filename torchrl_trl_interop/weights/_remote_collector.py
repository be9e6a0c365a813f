"""A push into a torchrl collector that runs in a Ray actor (``RayLLMCollector``).

torchrl's ``RayLLMCollector`` is a local handle on an ``LLMCollector`` in a Ray actor (read by
:func:`~torchrl_trl_interop._upstream._weights.ray_collector_handle`). Its ``update_policy_weights_`` sends a TensorDict keyed as the *policy's* parameters (a
torchrl LLM wrapper keeps its model under ``"model"``), waits for it without a bound, and the
collector's ``PolicyVersion`` then counts pushes. :func:`push_to_remote_collector` does the
push in the actor itself, in one call (``__ray_call__``): it reads the actor's policy, checks
the weights against it, puts them under ``"model"`` when the policy is a wrapper, applies them
through the collector's own ``update_policy_weights_``, and sets its integer ``PolicyVersion``
to the trainer's step, so rows collected after the push carry that step. The wait is bounded
(``timeout``, :data:`PUSH_TIMEOUT_S` by default) and an actor's death raises at once, naming
the collector.
"""

from __future__ import annotations

from typing import Any

from tensordict import TensorDict, TensorDictBase

from ._staleness import set_policy_version
from ._tensors import Layout, check_weights_fit, policy_model, weights_layout

__all__ = ["PUSH_TIMEOUT_S", "push_to_remote_collector"]

#: how long a push into another process's receiver may wait by default (a collector's Ray actor
#: waits for the batch in flight first)
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


def _get(ref: Any, what: str, timeout: float) -> Any:
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

    try:
        return ray.get(ref, timeout=timeout)
    except GetTimeoutError:
        raise TimeoutError(
            f"the RayLLMCollector's Ray actor did not answer {what} within {timeout}s (it "
            "finishes the batch in flight first: raise timeout= for long batches)."
        ) from None
    except RayActorError as error:
        raise RuntimeError(
            f"the RayLLMCollector's Ray actor died during {what}: {error}. Build a new "
            "collector; the actor's log says why it died."
        ) from None
    except RayTaskError as error:
        raise RuntimeError(f"the RayLLMCollector's actor failed on {what}:\n{error}") from None


def push_to_remote_collector(
    handle: Any,
    layout: Layout,
    stream: Any,
    version: int,
    *,
    partial: bool,
    timeout: float = PUSH_TIMEOUT_S,
) -> int:
    """Sends the streamed weights to the collector's actor (``handle``) as version ``version``;
    returns the bytes sent.

    Raises:
        KeyError: if names differ from the actor's policy model's; nothing is sent.
        ValueError: if shapes differ; nothing is sent.
        RuntimeError: if the actor died.
        TimeoutError: if the actor does not answer within ``timeout`` seconds.
    """
    what = "its policy's layout"
    receiver, wrapped = _get(handle.__ray_call__.remote(_receiver), what, timeout)
    check_weights_fit(layout, receiver, receiver_name="policy", partial=partial)
    weights = TensorDict(dict(stream), batch_size=[]).unflatten_keys(".")
    nbytes = sum(t.numel() * t.element_size() for t in weights.values(True, True))
    if wrapped:
        weights = TensorDict({"model": weights}, batch_size=[])
    what = f"the push of version {version}"
    _get(handle.__ray_call__.remote(_apply, weights, int(version)), what, timeout)
    return nbytes
