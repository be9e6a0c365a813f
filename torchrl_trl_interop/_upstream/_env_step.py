"""A chat environment's reset, its step and the move to the next, without torchrl's detours.

``TransformedEnv.step`` hands its input to ``Transform.inv``, which first copies it
(``clone(recurse=False)``) so that inverse transforms can write into the copy. On an LLM rollout
that input holds the policy's whole output (tokens, text, masks, log-probs and three
``History`` objects, per row), and copying it costs torchrl 0.14.1 about 9 ms per step of 8
rows, more than the rest of the step. When no transform of the environment has an inverse,
nothing would be written, and :func:`step` runs the same step on the input itself: the base
environment's step, its done keys completed, the transforms' step, the output checks, as
``TransformedEnv.step`` does, with the same result. Anything else (an inverse transform, a
subclass that overrides a step method, a partial step) goes through ``env.step``. One difference
remains, for a transform that breaks torchrl's rule that a step leaves its input unchanged: what
it writes into its step's input lands in the caller's tensordict (torchrl's copy would take it).

:func:`step_mdp` is ``env.step_mdp``: the next step's input, the input's entries with the
step's output in place of the old ones. torchrl copies every entry it carries over
(``TensorDict.copy``), which costs about 11 ms for 8 rows of a conversation with a tool reply;
here they are carried as they are, which the online loop can afford: it never reads the step's
input again.

The step's base part is ``ChatEnv``'s own, but for its copy of the conversation: torchrl
deep-copies the step's full History into the next prompt (~1.5 ms for 8 rows); here it gets new
containers over the same leaves, which protect the input as well (:func:`_next_history`).

:func:`reset` is ``env.reset`` for a ``ChatEnv`` given a batch of conversations (what the online
loop resets with): ``ChatEnv._reset`` lays the new ``ChatHistory`` out one row per conversation in
a lazy stack, converts its whole output to a lazy stack, and ``env.reset`` then reads it back into
the input tensordict, restacking every entry (~0.7 ms for 8 rows, more than the rest of the
reset). Here the rows are laid out once, as torchrl lays them out (the same objects: each row's
prompt is the conversation's own row), and the entries are set into the input as they are.

The upstream fixes: copy in ``Transform.inv`` only when a transform has inverse keys; carry
entries over in ``step_mdp`` without copying them (or copy History leaves as leaves); in
``ChatEnv._step_history``, copy the History's containers, not its leaves; in ``ChatEnv._reset``,
return its output without converting it to a lazy stack. With those four, :func:`reset`,
:func:`step` and :func:`step_mdp` are ``env.reset``, ``env.step`` and ``env.step_mdp``.

The functions read torchrl's internals (the environments' ``_step``, ``_step_proc_data``,
``_complete_done``, ``_assert_tensordict_shape``, ``_step_mdp``, ``_reset_check_done``,
``_supports_set_state``; ``Transform._inv_call``, ``_step``, ``_reset`` and
``_reset_env_preprocess``; ``ChatEnv._step_history`` and the reset's methods;
``_update_during_reset``) and tensordict's (``_new_unsafe``, a tensorclass's ``_tensordict`` and
``_from_tensordict``): they run on the versions they were measured on
(:data:`~torchrl_trl_interop._upstream.TORCHRL_MEASURED`,
:data:`~torchrl_trl_interop._upstream.TENSORDICT_MEASURED`); on any other, :func:`reset` is
``env.reset(td)``, :func:`step` is ``env.step(td)`` and :func:`step_mdp` is ``env.step_mdp(td)``.
"""

from __future__ import annotations

from typing import Any

from ._gate import TENSORDICT_MEASURED, TORCHRL_MEASURED, use_fast

__all__ = ["flat_transforms", "inverts", "reset", "step", "step_mdp"]

#: the internals this module reads (test/test_layout.py checks the list against the code)
READS = tuple(
    f"{owner}.{name}"
    for owner, names in {
        "torchrl.envs.Transform": "_inv_call _step _reset _reset_env_preprocess",
        "torchrl.envs.EnvBase": "_step _step_proc_data _assert_tensordict_shape _complete_done "
        "_step_mdp _reset_check_done _supports_set_state",
        "torchrl.envs.TransformedEnv": "_reset_proc_data",
        "torchrl.envs.llm.ChatEnv": "_step_history _reset _reset_history _query_to_history "
        "_align_history_batch",
        "torchrl.envs.utils": "_update_during_reset",
        "tensordict.TensorDict": "_new_unsafe",
        "tensordict.tensorclass": "_tensordict _from_tensordict",
    }.items()
    for name in names.split()
)


def flat_transforms(transform: Any) -> list:
    """The transforms of ``transform``, those inside a (nested) ``Compose`` too, in the order
    they run; ``[]`` for ``None``.

    Examples:
        >>> from torchrl.envs import Compose, StepCounter, UnsqueezeTransform
        >>> flat = flat_transforms(Compose(StepCounter(), Compose(UnsqueezeTransform(-1))))
        >>> [type(t).__name__ for t in flat]
        ['StepCounter', 'UnsqueezeTransform']
    """
    from torchrl.envs.transforms import Compose

    if isinstance(transform, Compose):
        return [t for inner in transform.transforms for t in flat_transforms(inner)]
    return [] if transform is None else [transform]


def inverts(transform: Any) -> bool:
    """Whether ``transform`` (a ``Compose`` too) may write anything in ``Transform.inv``.

    Examples:
        >>> from torchrl.envs import Compose, StepCounter, UnsqueezeTransform
        >>> inverts(Compose(StepCounter(max_steps=2)))
        False
        >>> inverts(UnsqueezeTransform(-1, in_keys_inv=["action"]))
        True
    """
    from torchrl.envs.transforms import Compose, Transform

    stack = [transform]
    while stack:
        t = stack.pop()
        if t is None:
            continue
        if type(t).inv is not Transform.inv:
            return True
        if type(t)._inv_call not in (Transform._inv_call, Compose._inv_call):
            return True
        if list(getattr(t, "in_keys_inv", None) or []):
            return True
        if isinstance(t, Compose):
            stack.extend(t.transforms)
    return False


def _plain_step(env: Any) -> bool:
    """Whether ``env`` steps exactly as ``TransformedEnv`` over a ``ChatEnv``, with no inverse."""
    from torchrl.envs import EnvBase, TransformedEnv
    from torchrl.envs.llm import ChatEnv

    base = getattr(env, "base_env", None)
    return (
        isinstance(env, TransformedEnv)
        and type(env).step is EnvBase.step
        and type(env)._step is TransformedEnv._step
        and type(env)._step_proc_data is EnvBase._step_proc_data
        and isinstance(base, ChatEnv)
        and type(base)._step is ChatEnv._step
        and not inverts(env.transform)
    )


def step(env: Any, td: Any) -> Any:
    """``env.step(td)``, skipping ``Transform.inv``'s copy of ``td`` when nothing inverts.

    Returns ``td`` with its ``"next"`` entry, as ``env.step`` does. The base environment and the
    transforms read ``td`` and write only the new ``"next"`` entry.

    Examples:
        >>> from tensordict import TensorDict, set_list_to_stack
        >>> from torchrl.data.llm import History
        >>> from torchrl.envs import StepCounter, TransformedEnv
        >>> from torchrl.envs.llm import ChatEnv
        >>> env = TransformedEnv(ChatEnv(batch_size=(1,), input_mode="history"),
        ...                      StepCounter(max_steps=1))
        >>> with set_list_to_stack(True):
        ...     chat = [[{"role": "user", "content": "Hi"}]]
        ...     td = env.reset(TensorDict(query=History.from_chats(chat), batch_size=[1]))
        ...     td["history"].full = History.from_chats([chat[0] + [
        ...         {"role": "assistant", "content": "Ho"}]])
        ...     step(env, td)["next", "done"]
        tensor([[True]])
    """
    if (
        not use_fast(TORCHRL_MEASURED, TENSORDICT_MEASURED)
        or not _plain_step(env)
        or "_step" in td.keys()
        or "next" in td.keys()
    ):
        return env.step(td)
    env._assert_tensordict_shape(td)
    base = env.base_env
    next_td = _next_history(base, td)
    base._complete_done(base.full_done_spec, next_td)
    next_td = env.transform._step(td, next_td)
    td.set("next", env._step_proc_data(next_td))
    return td


def _plain_reset(env: Any) -> bool:
    """Whether ``env`` resets exactly as ``TransformedEnv`` over a history-mode ``ChatEnv``
    resets, with no system prompt, device or state to set, and no transform that rewrites the
    reset's input."""
    from torchrl.envs import EnvBase, TransformedEnv
    from torchrl.envs.llm import ChatEnv
    from torchrl.envs.transforms import Transform

    base = getattr(env, "base_env", None)
    if not isinstance(env, TransformedEnv) or not isinstance(base, ChatEnv):
        return False
    cls, base_cls = type(env), type(base)
    return (
        cls.reset is EnvBase.reset
        and cls._reset is TransformedEnv._reset
        and cls._reset_proc_data is TransformedEnv._reset_proc_data
        and cls._reset_check_done is EnvBase._reset_check_done
        and base_cls._reset is ChatEnv._reset
        and base_cls._reset_history is ChatEnv._reset_history
        and base_cls._query_to_history is ChatEnv._query_to_history
        and base_cls._align_history_batch is ChatEnv._align_history_batch
        and base.input_mode == "history"
        and base.system_prompt is None
        and base.device is None
        and not env._supports_set_state
        and not inverts(env.transform)
        and all(
            type(t)._reset_env_preprocess is Transform._reset_env_preprocess
            for t in flat_transforms(env.transform)
        )
    )


def reset(env: Any, td: Any) -> Any:
    """``env.reset(td)``, its new ``ChatHistory`` laid out once, as torchrl lays it out.

    For a ``ChatEnv`` (in a ``TransformedEnv``) reset with a batch of conversations at its
    ``data_key``, one ``[T]`` History row per conversation in a lazy stack (what
    :func:`~torchrl_trl_interop.messages_to_history` builds): as ``env.reset``, the transforms'
    reset runs on the new entries, the done entries are completed and checked, and ``td`` is
    returned with them, each row's prompt being that conversation's own row. Any other input or
    environment goes through ``env.reset(td)``.

    Examples:
        >>> from tensordict import TensorDict
        >>> from torchrl_trl_interop import messages_to_history
        >>> from torchrl_trl_interop.testing import toy_chat_env
        >>> env = toy_chat_env(batch_size=2, max_steps=2)
        >>> query = messages_to_history([[{"role": "user", "content": "Hi"}]] * 2)
        >>> td = reset(env, TensorDict({"query": query}, batch_size=[2]))
        >>> td["history"].prompt.batch_size, td["step_count"].flatten().tolist()
        (torch.Size([2, 1]), [0, 0])
    """
    from tensordict import LazyStackedTensorDict, TensorDict
    from torchrl.data.llm import History
    from torchrl.envs.utils import _update_during_reset
    from torchrl.modules.llm import ChatHistory

    from ._lazy_rows import stack_rows

    if not use_fast(TORCHRL_MEASURED, TENSORDICT_MEASURED) or not _plain_reset(env):
        return env.reset(td)
    base = env.base_env
    query = td.get(base.data_key, None)
    layout = getattr(query, "_tensordict", None)
    if (
        type(query) is not History
        or type(td) is not TensorDict
        or td.device is not None
        or query.batch_size[:-1] != env.batch_size
        or type(layout) is not LazyStackedTensorDict
        or layout.stack_dim != 0
        or not all(type(row) is TensorDict and row.batch_dims == 1 for row in layout.tensordicts)
        or any(key in td.keys(True) for key in env.reset_keys)
    ):
        return env.reset(td)
    env._assert_tensordict_shape(td)
    # TransformedEnv._reset: the reset's input is the reset and state keys of td
    selected = td.select(*env.reset_keys, *env.state_spec.keys(True, True), strict=False)
    prompts = [History._from_tensordict(row) for row in layout.tensordicts]
    out = TensorDict._new_unsafe(
        {"history": stack_rows(ChatHistory, prompt=prompts)}, batch_size=td.batch_size
    ).update(selected)  # ChatEnv._reset_history, then its update with the input
    base._complete_done(base.full_done_spec, out)
    out = env.transform._reset(selected, out)
    env._reset_check_done(td, out)
    return _update_during_reset(out, td, env.reset_keys)


def _next_history(base: Any, td: Any) -> Any:
    """``ChatEnv._step`` in history mode: the next prompt is the step's full History.

    torchrl deep-copies that History (``TensorDict.set`` clones a value it must re-batch,
    ~1.5 ms for 8 rows) so that a tool transform extending the new prompt in place
    (``history.extend(..., inplace=True)``) leaves the step's input alone. Extending replaces a
    History's containers, never its leaves, so new containers over the same leaves protect the
    input as well: one ``TensorDict`` per row and a lazy stack of them, as torchrl's copy lays
    them out. Any other layout, or an environment with a device, is ``base._step(td)``.
    """
    from tensordict import LazyStackedTensorDict, TensorDict
    from torchrl.envs.llm import ChatEnv
    from torchrl.modules.llm import ChatHistory

    chat = td.get("history", None) if base.input_mode == "history" else None
    full = getattr(chat, "full", None)
    layout = getattr(full, "_tensordict", None)
    if (
        type(base)._step_history is not ChatEnv._step_history
        or base.device is not None
        or not isinstance(layout, LazyStackedTensorDict)
        or not all(type(row) is TensorDict for row in layout.tensordicts)
    ):
        return base._step(td)
    rows = [
        TensorDict._new_unsafe(dict(row.items()), batch_size=row.batch_size, device=row.device)
        for row in layout.tensordicts
    ]
    prompt = type(full)._from_tensordict(LazyStackedTensorDict(*rows, stack_dim=layout.stack_dim))
    history = TensorDict._new_unsafe({"prompt": prompt}, batch_size=td.batch_size)
    out = td.empty()
    out.set("history", ChatHistory._from_tensordict(history))
    return out


def _flat_step_mdp(env: Any) -> bool:
    """Whether torchrl's ``step_mdp`` of ``env`` keeps the input's other entries and moves whole
    top-level entries (no key set reaches inside an entry)."""
    mdp = getattr(env, "_step_mdp", None)
    trees = getattr(mdp, "exclude_from_root", None), getattr(mdp, "keys_from_next", None)
    return (
        getattr(mdp, "keep_other", False) is True
        and all(isinstance(tree, dict) for tree in trees)
        and all(sub is None for tree in trees for sub in tree.values())
    )


def step_mdp(env: Any, td: Any) -> Any:
    """``env.step_mdp(td)``, with the entries carried over as they are, not copied.

    The same keys and values as torchrl's: every entry of ``td`` but ``"next"``, the done,
    reset and reward keys, then the observations and done keys of ``td["next"]`` in place of the
    old ones; a lazy stack row by row, as torchrl does. Where torchrl's key sets reach inside an
    entry, or only the step's output is a lazy stack, it is ``env.step_mdp(td)``.

    Examples:
        >>> from tensordict import TensorDict
        >>> from torchrl_trl_interop.testing import ScriptedChatPolicy, toy_chat_env
        >>> env = toy_chat_env(batch_size=1, max_steps=2)
        >>> td = env.reset(TensorDict({"query": ["Hi"]}, batch_size=[1]))
        >>> td = step_mdp(env, step(env, ScriptedChatPolicy(["Ho"])(td)))
        >>> td["step_count"], "next" in td.keys()
        (tensor([[1]]), False)
    """
    if not use_fast(TORCHRL_MEASURED) or not _flat_step_mdp(env) or "next" not in td.keys():
        return env.step_mdp(td)
    return _carry(env._step_mdp, td)


def _carry(mdp: Any, td: Any) -> Any:
    from tensordict import LazyStackedTensorDict, lazy_stack

    if isinstance(td, LazyStackedTensorDict):
        return lazy_stack([_carry(mdp, row) for row in td.tensordicts], td.stack_dim)
    next_td = td.get("next")
    if isinstance(next_td, LazyStackedTensorDict):  # torchrl restacks the input: its way
        return mdp(td)
    out = td.empty()
    for key in td.keys():
        if key not in mdp.exclude_from_root:
            out.set(key, td.get(key))
    for key in mdp.keys_from_next:
        value = next_td.get(key, None)
        if value is not None:
            out.set(key, value)
    return out
