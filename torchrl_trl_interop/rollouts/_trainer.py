"""The one reader of a TRL trainer: what the package reads of ``GRPOTrainer`` and its kin.

A rollout function is called with the trainer itself (``rollout_func(prompts, trainer)``).
Everything the package reads of it, public or private, goes through the small functions here,
so supporting another TRL trainer or version touches this module alone
(``test/test_layout.py`` checks that no other module reads a trainer's attributes).

Measured on ``trl`` 1.16 (:data:`TRL_MEASURED`) with ``GRPOTrainer``, the one trainer that
calls a rollout function; ``RLOOTrainer`` of the same release holds every attribute below under
the same name. ``AsyncGRPOTrainer`` is not read: it drives
:class:`~torchrl_trl_interop.TorchRLRolloutWorker` through TRL's worker protocol. What is read,
and by which function:

================================= ==============================================================
function                          the trainer's attributes it reads
================================= ==============================================================
:func:`trainer_model`             ``model`` (``wrapped=True``: ``model_wrapped``)
:func:`unwrapped_model`           ``accelerator.unwrap_model(model)``
:func:`trainer_accelerator`       ``accelerator`` (its ranks, ``gather``)
:func:`is_training`               ``model.training`` (TRL's mode: ``"train"`` or ``"eval"``)
:func:`group_size`                ``num_generations``, ``num_generations_eval``
:func:`process_slice`             ``accelerator.process_index`` (TRL's ``process_slice``)
:func:`trainer_tokenizer`         ``_tokenizer`` (private), else ``processing_class``
:func:`distributed_backend`       ``_dist`` (private), else ``DistributedBackend(accelerator)``
:func:`trainer_generation_config` ``generation_config``, else ``args`` and ``eos_token_ids``
:func:`trainer_eos_ids`           ``eos_token_ids``, else ``generation_config``
:func:`trainer_chat_template`     ``chat_template`` (TRL's training variant, set for tool loops)
                                  and ``args.chat_template_kwargs``
:func:`sampling_temperature`      ``temperature``
:func:`training_args`             ``args`` (``per_device_train_batch_size``, ZeRO-3 gathering)
:func:`trainer_reward_funcs`      ``reward_funcs``
:func:`global_step`               ``state.global_step``
:func:`vllm_backend`              ``use_vllm``, ``vllm_generation``, ``vllm_mode``
:func:`log_metrics`               ``_log_metric`` (private): the one way metrics reach it
:func:`attach_vllm_generation`    sets ``use_vllm``, ``vllm_mode``, ``vllm_generation`` and
                                  ``_last_loaded_step`` (private; ``testing``'s toy vLLM)
================================= ==============================================================

The private attributes are read only on the TRL versions they were measured on; on another
version ``_tokenizer`` gives way to the public ``processing_class``, ``_dist`` to
``trl.distributed.DistributedBackend(trainer.accelerator)``, and ``_log_metric`` and
``_last_loaded_step``, which have no public counterpart, raise an error that names them. TRL
would retire them by passing ``log_metric`` to the rollout function, as it does to reward
functions.
"""

from __future__ import annotations

import copy
import warnings
from importlib import metadata
from typing import Any

from .._upstream import measured_on

__all__ = [
    "TRL_MEASURED",
    "attach_vllm_generation",
    "distributed_backend",
    "global_step",
    "group_size",
    "is_training",
    "log_metrics",
    "process_slice",
    "sampling_temperature",
    "trainer_accelerator",
    "trainer_chat_template",
    "trainer_eos_ids",
    "trainer_generation_config",
    "trainer_model",
    "trainer_reward_funcs",
    "trainer_tokenizer",
    "training_args",
    "unwrapped_model",
    "vllm_backend",
]

#: The ``trl`` versions whose trainers' private attributes this module reads.
TRL_MEASURED: tuple[str, str, str] = ("trl", "1.16", "1.17")


#: Whether the one warning about logging on an unmeasured trl was given.
_WARNED_UNMEASURED: list[bool] = []


def _measured() -> bool:
    return measured_on(*TRL_MEASURED)


def _unmeasured(trainer: Any, name: str, what: str) -> RuntimeError:
    package, low, high = TRL_MEASURED
    try:
        installed = metadata.version(package)
    except metadata.PackageNotFoundError:
        installed = "not installed"
    return RuntimeError(
        f"{type(trainer).__name__}.{name}: {what} through the trainer's private {name}, read on "
        f"trl >= {low}, < {high} only (installed: trl {installed}). Install "
        f"'trl>={low},<{high}', or check that {name} still does this in your trl and widen "
        "TRL_MEASURED in torchrl_trl_interop/rollouts/_trainer.py."
    )


def trainer_model(trainer: Any, *, wrapped: bool = False) -> Any:
    """The trainer's ``model`` (``wrapped=True``: ``model_wrapped``, the accelerate/DDP one)."""
    if wrapped:
        return getattr(trainer, "model_wrapped", None) or trainer.model
    return trainer.model


def unwrapped_model(trainer: Any) -> Any:
    """The trainer's model out of its accelerate wrapper (the object the optimizer updates)."""
    accelerator = getattr(trainer, "accelerator", None)
    return trainer.model if accelerator is None else accelerator.unwrap_model(trainer.model)


def trainer_accelerator(trainer: Any) -> Any:
    """The trainer's ``accelerator`` (``None`` for a stand-in without one)."""
    return getattr(trainer, "accelerator", None)


def is_training(trainer: Any) -> bool:
    """Whether the trainer is training (TRL's mode ``"train"``) rather than evaluating.

    Examples:
        >>> from types import SimpleNamespace
        >>> is_training(SimpleNamespace(model=SimpleNamespace(training=False)))
        False
    """
    return bool(getattr(getattr(trainer, "model", None), "training", True))


def group_size(trainer: Any) -> int:
    """Rows per prompt, as TRL groups them: ``num_generations`` in training,
    ``num_generations_eval`` in evaluation (``num_generations`` when unset).

    Examples:
        >>> from types import SimpleNamespace
        >>> evaluating = SimpleNamespace(training=False)
        >>> group_size(SimpleNamespace(num_generations=4, num_generations_eval=2, model=evaluating))
        2
        >>> group_size(SimpleNamespace(num_generations=4, model=evaluating))
        4
    """
    name = "num_generations" if is_training(trainer) else "num_generations_eval"
    group = getattr(trainer, name, None)
    return int(group or getattr(trainer, "num_generations", 1) or 1)


def process_slice(trainer: Any, count: int) -> slice:
    """The positions of this process's ``count`` prompts in the generation batch of all
    processes (TRL's ``process_slice``: rank ``r`` holds ``r * count .. (r + 1) * count - 1``).

    Examples:
        >>> from types import SimpleNamespace
        >>> process_slice(SimpleNamespace(accelerator=SimpleNamespace(process_index=2)), 4)
        slice(8, 12, None)
    """
    index = int(getattr(trainer_accelerator(trainer), "process_index", 0) or 0)
    return slice(index * count, (index + 1) * count)


def trainer_tokenizer(trainer: Any) -> Any:
    """The trainer's tokenizer (a processor's ``.tokenizer`` for multimodal processing classes).

    Examples:
        >>> from types import SimpleNamespace
        >>> from torchrl_trl_interop.testing import toy_tokenizer
        >>> tok = toy_tokenizer()
        >>> trainer_tokenizer(SimpleNamespace(processing_class=tok)) is tok
        True
    """
    tokenizer = getattr(trainer, "_tokenizer", None) if _measured() else None
    tokenizer = tokenizer or trainer.processing_class
    return getattr(tokenizer, "tokenizer", tokenizer)


def distributed_backend(trainer: Any) -> Any:
    """TRL's view of the distributed backend (``DistributedBackend``: ZeRO stage, FSDP version)."""
    backend = getattr(trainer, "_dist", None) if _measured() else None
    if backend is None:
        from trl.distributed import DistributedBackend

        backend = DistributedBackend(trainer.accelerator)
    return backend


def sampling_temperature(trainer: Any) -> float:
    """The temperature the trainer samples and scores log-probs with."""
    return trainer.temperature


def training_args(trainer: Any) -> Any:
    """The trainer's ``args`` (its ``GRPOConfig``; ``None`` for a stand-in without one)."""
    return getattr(trainer, "args", None)


def trainer_reward_funcs(trainer: Any) -> list:
    """The trainer's reward functions (``[]`` when it has none)."""
    return list(getattr(trainer, "reward_funcs", None) or [])


def global_step(trainer: Any) -> int:
    """The trainer's optimizer step (``state.global_step``)."""
    return int(trainer.state.global_step)


def vllm_backend(trainer: Any) -> tuple[Any, str] | None:
    """TRL's vLLM backend (``vllm_generation``) and its mode; ``None`` without ``use_vllm``.

    Examples:
        >>> from types import SimpleNamespace
        >>> vllm_backend(SimpleNamespace(use_vllm=False)) is None
        True
    """
    if not getattr(trainer, "use_vllm", False):
        return None
    generation = getattr(trainer, "vllm_generation", None)
    return generation, getattr(trainer, "vllm_mode", getattr(generation, "mode", "server"))


def log_metrics(trainer: Any, values: dict[str, list[float]]) -> None:
    """Logs each value through the trainer's ``_log_metric``: TRL averages a metric's values
    over every process and logs it with the step's own metrics (``kl``, ``reward``...).

    A trainer without ``_log_metric`` (a stand-in) logs nothing.

    On a ``trl`` outside :data:`TRL_MEASURED`, a trainer that still has ``_log_metric`` logs
    through it, with one warning that the version was not measured.

    Raises:
        RuntimeError: if there is a value to log, the installed ``trl`` is not one of
            :data:`TRL_MEASURED` and the trainer has no ``_log_metric``.

    Examples:
        >>> from types import SimpleNamespace
        >>> logged = []
        >>> trainer = SimpleNamespace(_log_metric=lambda name, value: logged.append((name, value)))
        >>> log_metrics(trainer, {"rollout/candidates": [8, 8]})
        >>> logged
        [('rollout/candidates', 8.0), ('rollout/candidates', 8.0)]
    """
    if not any(values.values()):
        return
    log = getattr(trainer, "_log_metric", None)
    if not _measured():
        names = ", ".join(values)
        error = _unmeasured(trainer, "_log_metric", f"the rollout metrics ({names}) are logged")
        if not callable(log):
            raise error
        if not _WARNED_UNMEASURED:
            _WARNED_UNMEASURED.append(True)
            warnings.warn(f"{error} Logging through it anyway.", UserWarning, stacklevel=2)
    if callable(log):
        for name, rows in values.items():
            for value in rows:
                log(name, float(value))


def attach_vllm_generation(trainer: Any, generation: Any, mode: str = "server") -> None:
    """Sets a built trainer to generate through ``generation`` (a TRL ``VLLMGeneration``), as
    ``GRPOTrainer.__init__`` does under ``use_vllm=True``: the weights are pushed before the
    next step's first generation (``_last_loaded_step``).

    Raises:
        RuntimeError: if the installed ``trl`` is not one of :data:`TRL_MEASURED`.
    """
    if not _measured():
        raise _unmeasured(trainer, "_last_loaded_step", "the vLLM weight sync is scheduled")
    trainer.use_vllm, trainer.vllm_mode = True, mode
    trainer.vllm_generation, trainer._last_loaded_step = generation, -1


def trainer_chat_template(trainer: Any) -> tuple[str | None, dict[str, Any]]:
    """The chat template a TRL trainer renders its prompts with, when it is not its tokenizer's
    (``None`` then), and its ``chat_template_kwargs``: what ``GRPOTrainer`` passes to every
    ``apply_chat_template`` call.

    Examples:
        >>> from types import SimpleNamespace
        >>> args = SimpleNamespace(chat_template_kwargs={"enable_thinking": False})
        >>> trainer_chat_template(SimpleNamespace(chat_template=None, args=args))
        (None, {'enable_thinking': False})
    """
    args = getattr(trainer, "args", None)
    kwargs = getattr(args, "chat_template_kwargs", None) or {}
    if isinstance(kwargs, str):  # GRPOConfig takes a JSON string from the command line
        import json

        kwargs = json.loads(kwargs)
    return getattr(trainer, "chat_template", None), dict(kwargs)


def trainer_eos_ids(trainer: Any, tokenizer: Any) -> list[int]:
    """The ids that end a TRL trainer's generations (``GRPOTrainer.eos_token_ids``: the
    tokenizer's eos and those of the model's generation config), the tokenizer's eos alone for
    a trainer that holds neither list.

    Examples:
        >>> from types import SimpleNamespace
        >>> from torchrl_trl_interop.testing import toy_tokenizer
        >>> trainer_eos_ids(SimpleNamespace(eos_token_ids=[2, 7]), None)
        [2, 7]
        >>> trainer_eos_ids(SimpleNamespace(), toy_tokenizer())
        [2]
    """
    ids = getattr(trainer, "eos_token_ids", None)
    if ids is None:
        ids = getattr(getattr(trainer, "generation_config", None), "eos_token_id", None)
    if ids is None:
        ids = tokenizer.eos_token_id
    return [ids] if isinstance(ids, int) else [int(i) for i in ids or []]


def trainer_generation_config(trainer: Any, tokenizer: Any, *, model: Any = None) -> Any:
    """A copy of the ``GenerationConfig`` a TRL trainer generates with, pad suppressed.

    ``GRPOTrainer`` builds it from ``max_completion_length``, ``temperature``, ``top_p``,
    ``top_k``, ``min_p``, ``repetition_penalty``, ``cache_implementation`` and
    ``generation_kwargs`` (vLLM trainers build none: it is made from the same arguments). The pad
    token is added to ``suppress_tokens`` when it is not an eos token: torchrl's own wrappers and
    masks tell padding by the pad id, so a sampled pad token would pass for padding downstream.

    ``trainer`` may also be the trainer's ``GRPOConfig``, before the trainer exists (a generator
    in another process is built before the trainer whose rollout function uses it): the config is
    then made as ``GRPOTrainer`` makes it for a text model, the eos ids being the tokenizer's and
    those ``model.generation_config`` declares.

    Examples:
        >>> from trl import GRPOConfig
        >>> from torchrl_trl_interop.testing import toy_tokenizer
        >>> args = GRPOConfig("out", max_completion_length=8, temperature=0.7, bf16=False)
        >>> config = trainer_generation_config(args, toy_tokenizer())
        >>> config.max_new_tokens, config.temperature, config.suppress_tokens
        (8, 0.7, [0])
    """
    from transformers import TrainingArguments

    if isinstance(trainer, TrainingArguments):
        eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
        if tokenizer.eos_token_id not in eos:
            eos = [tokenizer.eos_token_id, *eos]
        config = _generation_config(trainer, tokenizer, eos)
    elif getattr(trainer, "generation_config", None) is not None:
        config = copy.deepcopy(trainer.generation_config)
    else:
        config = _generation_config(trainer.args, tokenizer, list(trainer.eos_token_ids))
    eos = config.eos_token_id
    eos = set(eos if isinstance(eos, (list, tuple)) else [eos])
    pad = tokenizer.pad_token_id
    if pad is not None and pad not in eos:
        config.suppress_tokens = sorted(set(config.suppress_tokens or []) | {pad})
    return config


def _generation_config(args: Any, tokenizer: Any, eos_token_ids: list[int]) -> Any:
    """``GRPOTrainer``'s ``GenerationConfig`` for a text model (TRL 1.16, ``__init__``)."""
    from transformers import GenerationConfig

    kwargs = {
        "max_new_tokens": args.max_completion_length,
        "do_sample": True,
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": eos_token_ids,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "top_k": args.top_k,
        "min_p": args.min_p,
        "repetition_penalty": args.repetition_penalty,
        "cache_implementation": args.cache_implementation,
        **(args.generation_kwargs or {}),
    }
    return GenerationConfig(**kwargs, disable_compile=True)
