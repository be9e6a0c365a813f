"""TorchRL environments inside TRL's own tool loop: ``GRPOTrainer(environment_factory=...)``.

TRL 1.16's ``GRPOTrainer`` keeps generation (its own ``generate``, or vLLM), parses the model's
tool calls with its response parser, and calls tools by name: every public function defined on
the class of the instances ``environment_factory()`` returns is a tool, ``reset(**row)`` starts a
rollout, and reward functions receive the instances as ``environments=``.
:func:`as_trl_environment_factory` builds such a factory around a TorchRL LLM environment: one
tool method per tool the environment carries (``_tools``), each call stepping the environment
(``_tool_env``), and a reward function that closes each episode with the completion's final
answer and returns the environment's own reward.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tensordict.utils import NestedKey

from .._checks import as_mapping, as_names, boundary, check_bool, require, speaking_for
from .._keys import NEXT_DONE_KEY, NEXT_REWARD_KEY, as_nested_key, key_parts
from ._chat_episode import check_chat_env
from ._tool_env import PUBLIC_NAMES, TorchRLEnvironment, get_reward
from ._tool_schemas import function_with_signature
from ._tools import env_transforms, find_tools, tool_transforms
from ._trl_prompts import has_prompt_source
from ._trl_tools import check_tool_template

__all__ = ["as_trl_environment_factory"]


class _EnvRewardFunc:
    """The TRL reward function of a factory (see :func:`as_trl_environment_factory`)."""

    def __init__(self, name: str, token: str) -> None:
        self.__name__ = name
        self.token = token

    def __repr__(self) -> str:
        return f"<reward function {self.__name__!r} of as_trl_environment_factory>"

    def __call__(
        self,
        prompts: list | None = None,
        completions: list | None = None,
        environments: list | None = None,
        **kwargs: Any,
    ) -> list[float | None]:
        if environments is None:
            raise TypeError(
                f"{self.__name__}: called without environments=. GRPOTrainer passes them when it "
                "is built with environment_factory=...; AsyncGRPOTrainer (TRL 1.16) does not pass "
                "them to reward functions."
            )
        if completions is None or len(completions) != len(environments):
            raise ValueError(
                f"{self.__name__}: got {len(environments)} environments for "
                f"{None if completions is None else len(completions)} completions; expected one "
                "environment per completion."
            )
        with speaking_for("as_trl_environment_factory"):  # an episode's close names the factory
            return [
                env._close(c) if getattr(env, "_token", None) == self.token else None
                for c, env in zip(completions, environments)
            ]


@dataclass(repr=False)
class _EnvironmentFactory:
    """The zero-argument factory :func:`as_trl_environment_factory` returns (see there).

    ``token`` marks the instances it builds, so that its ``reward_func`` scores only those (in
    this process and where it is unpickled).
    """

    make_env: Callable[[], Any]
    name: str
    rename: dict[str, str]
    row_keys: list[str] | None
    reward_key: NestedKey
    done_key: NestedKey
    env_reward: bool = True  # whether the instances define get_reward
    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    _cls: type | None = None  # the instances' class, built once per process
    _spare: Any = None  # the environment built to check make_env, handed to the first instance

    def __post_init__(self) -> None:
        self.reward_func = _EnvRewardFunc(self.name, self.token)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_cls": None, "_spare": None}  # built again where unpickled

    def __repr__(self) -> str:
        tools = None if self._cls is None else list(self._cls._tools)
        return f"as_trl_environment_factory({self.name!r}, tools={tools})"

    @boundary("as_trl_environment_factory")
    def __call__(self) -> TorchRLEnvironment:
        env, self._spare = self._spare or self._make(), None
        cls = self._cls or self._build_class(env)
        return cls(env)

    def _make(self) -> Any:
        env = self.make_env()
        check_chat_env(env, "TRL runs one instance per rollout")
        return env

    def _build_class(self, env: Any) -> type:
        tools = find_tools(tool_transforms(env), self.rename, reserved=PUBLIC_NAMES)
        step_key = key_parts(self.reward_key)[-1]
        writes_reward = any(
            step_key in [key_parts(k)[-1] for k in getattr(t, "out_keys", [])]
            for t in env_transforms(env)
        )
        if not tools and not writes_reward and not has_prompt_source(env):
            raise ValueError(
                "the environment has no tool transform, no transform writing a reward at "
                f"{self.reward_key!r} and no prompt source: nothing to bridge into TRL. Add a "
                "tool transform (SimpleToolTransform, ExecuteToolsInOrder, MCPToolTransform, "
                "PythonInterpreter), a reward transform (RewardTransform, a torchrl reward "
                "parser) or a DataLoadingPrimer serving its prompts."
            )
        body = {"_tools": {t.name: t for t in tools}, "_factory": self, "_token": self.token}
        if writes_reward and self.env_reward:  # TRL 1.16 adds it as a reward source itself
            body["get_reward"] = get_reward
        for tool in tools:
            call = _tool_body(tool.name, tool.signature.is_async)
            method = function_with_signature(call, tool.signature, method=True)
            body[tool.name] = boundary("as_trl_environment_factory")(method)  # TRL calls it
        self._cls = type(_class_name(self.name), (TorchRLEnvironment,), body)
        return self._cls

    def _columns(self, row: Mapping[str, Any]) -> list[str]:
        """The row's columns that go into the reset tensordict (``row_keys``, else all but the
        prompt); :func:`~._chat_episode.reset_input` refuses those named like the env's entries.

        Raises:
            KeyError: if a ``row_keys`` column is missing from the row.
        """
        columns = [k for k in row if k != "prompt"] if self.row_keys is None else self.row_keys
        missing = [k for k in columns if k not in row]
        if missing:
            raise KeyError(
                f"row_keys names {missing}, missing from the dataset row (columns: {sorted(row)})."
            )
        return list(columns)


def _tool_body(name: str, is_async: bool) -> Callable[..., Any]:
    def body(self: TorchRLEnvironment, **arguments: Any) -> Any:
        call = self._acall_tool if is_async else self._call_tool  # async: a coroutine, awaited
        return call(name, **arguments)

    return body


def _class_name(name: str) -> str:
    words = "".join(c if c.isalnum() else " " for c in name).split()
    return "".join(w[:1].upper() + w[1:] for w in words) or "TorchRLEnvironment"


def _default_name(make_env: Any) -> str:
    func = getattr(make_env, "func", make_env)  # functools.partial
    name = getattr(func, "__name__", None) or type(func).__name__
    return name.removeprefix("make_") or name


@boundary("as_trl_environment_factory")
def as_trl_environment_factory(
    make_env: Callable[[], Any],
    *,
    name: str | None = None,
    rename: Mapping[str, str] | None = None,
    row_keys: Sequence[str] | None = None,
    reward_key: NestedKey = NEXT_REWARD_KEY,
    done_key: NestedKey = NEXT_DONE_KEY,
    processing_class: Any = None,
    get_reward: bool = True,
):
    """A TorchRL LLM environment as ``GRPOTrainer(environment_factory=...)``: its tools in TRL's
    own tool loop, its reward as a TRL reward function.

    TRL keeps generation (its own ``generate``, or vLLM in server or colocate mode), parses the
    model's tool calls with its response parser, runs the tool loop, masks tool tokens and logs
    ``tools/call_frequency``. The returned factory builds, per rollout, an instance around its
    own TorchRL environment (``make_env()``), whose class has:

    * ``reset(**row)``: resets the environment with the row's ``prompt`` (a message list, or
      text as one user turn); the row's other columns (or ``row_keys``) go into the reset
      tensordict, where reward parsers read them (e.g. ``"answer"``). It returns what the
      environment appended to the prompt's last message, or ``None``. A row without
      ``prompt`` starts from TRL's empty user turn; an environment with its own prompt source
      (a ``DataLoadingPrimer``) is reset without the row's prompt and returns the one it serves,
      which TRL appends to the last message it shows. An environment that
      changes the prompt in another way (a ``ChatEnv(system_prompt=...)``) raises: the model,
      prompted by TRL with the dataset's prompt, would not see it.
    * one method per tool the environment carries: ``SimpleToolTransform``'s functions (signature
      from ``tool_schemas`` when given, else from the function), ``ExecuteToolsInOrder``'s
      ``ToolRegistry`` services (from ``schema_in``), ``MCPToolTransform``'s tools (from their
      JSON schemas) and ``PythonInterpreter`` (``python(code)``), each with the signature, type
      hints and Google-style docstring TRL renders. A call is written as the tool transform reads
      it (e.g. ``<tool>add\\n{"a": 2, "b": 3}</tool>``, the text a TorchRL policy would write)
      and the environment is stepped with it as an assistant turn: its transforms run, its
      History holds the call and the tool's reply, its step counter advances. The method returns
      the reply exactly as the environment wrote it into its History. An error (a missing
      argument, a call after the episode ended) is raised, and TRL feeds it back to the model.
    * the properties ``env`` (the TorchRL environment), ``messages`` (its conversation as TRL
      messages) and ``reward`` (the sum of its rewards so far, ``None`` if none was written).
    * ``get_reward()``, when the environment writes a reward (and ``get_reward=True``): TRL 1.16
      adds it as a reward source itself (weight 1, the class's name; ``reward_funcs`` then
      optional). It sums the rewards of the steps not yet handed to TRL; it never sees the final
      answer. A reward function that reads ``env.reward`` (as TRL's own OpenEnv examples do)
      scores the episode itself: ``get_reward`` then returns ``None`` for it (TRL ignores a
      ``None``), so no reward is counted twice. Build the factory with ``get_reward=False`` to
      leave it out altogether (no extra reward column in TRL's logs; an ``async`` reward
      function reading ``env.reward`` after an ``await`` needs it: TRL runs ``get_reward``
      first).

    Tool methods raise ``ToolFailed`` when the tool raised (TRL counts it in
    ``tools/failure_frequency``; the environment's History holds the reply), an async tool's
    method is a coroutine function, and ``get_json_schema`` of a method is the tool function's.

    ``factory.reward_func`` is a TRL reward function, named after the environment (``name``):
    for each completion it closes that completion's episode with the final answer (the last
    assistant turn, when it calls no tool: one more step) and returns the environment's reward
    at ``reward_key`` summed over the episode's steps (the reward transforms', e.g.
    :class:`~torchrl_trl_interop.RewardTransform` or torchrl's reward parsers), or ``None``
    where the environment wrote none. The environment's conversation is then the prompt, the
    calls, the replies and the final answer, as the model saw them. Pass it as
    ``reward_funcs=factory.reward_func`` (or next to other reward functions) when the
    environment scores the final answer. Each step's reward reaches TRL once: through
    ``reward_func`` or ``get_reward``, whichever reads it first.

    ================================ ============================== ==========================
    the model's turn (TRL)           the TorchRL environment        returned to TRL
    ================================ ============================== ==========================
    ``add(a=2, b=3)`` (a tool call)  one step with the call         the reply from its History
    the final answer                 one step (in ``reward_func``)  the summed reward
    ================================ ============================== ==========================

    TRL calls the tools of one turn one after the other: a turn with several calls is stepped
    once per call, so the environment's History holds one assistant turn per call. Text the model
    writes next to a call is not passed to the tool (TRL passes only the arguments). When TRL
    drops a tool reply that would overflow ``max_completion_length``, the environment has already
    run that call. The factory pickles when ``make_env`` does (``AsyncGRPOTrainer`` builds
    environments in a spawned process); TRL 1.16's ``AsyncGRPOTrainer`` passes no
    ``environments=`` to reward functions, so ``reward_func`` runs with ``GRPOTrainer``.

    Args:
        make_env (callable): a zero-argument callable (a module-level function or
            ``functools.partial``, so it pickles) returning a TorchRL
            :class:`~torchrl.envs.llm.ChatEnv` in ``input_mode="history"`` with
            ``batch_size=(1,)``, or a ``TransformedEnv`` around one with tool and reward
            transforms. It is called once now, to check the environment and list its tools.

    Keyword Args:
        name (str, optional): names the reward function (``rewards/<name>/mean`` in TRL's logs)
            and the instances' class. Defaults to ``make_env``'s name without ``make_``.
        rename (dict, optional): ``{tool name: method name}``, for a tool whose name is not a
            Python identifier, is a keyword, or is taken (``reset``, ``get_reward``, ``env``,
            ``messages``, ``reward``, another tool's). MCP tools are keyed ``"server.tool"``.
        row_keys (list of str, optional): the dataset columns put into the reset tensordict.
            Defaults to every column but ``prompt``.
        reward_key (NestedKey, optional): the environment's reward after a step. Defaults to
            ``("next", "reward")``.
        done_key (NestedKey, optional): the done flag after a step; once set, tool calls raise
            and the final answer is not stepped. Defaults to ``("next", "done")``.
        processing_class (tokenizer, optional): the trainer's tokenizer; when given, checked to
            render tool calls and to be parsed by TRL (its chat template one of TRL's shipped
            templates, ``trl/chat_templates/*.jinja``).
        get_reward (bool, optional): whether the instances define ``get_reward`` when the
            environment writes a reward (TRL then adds it as a reward source). Defaults to
            ``True``.

    Returns:
        a picklable zero-argument factory for ``GRPOTrainer(environment_factory=...)``, with
        ``factory.reward_func``.

    Raises:
        TypeError: if ``make_env`` is not callable or returns an environment that takes no
            prompt at reset (not a ChatEnv); if it carries a tool transform whose tools cannot
            be listed, or a tool function without type hints.
        ValueError: if the environment has neither a tool nor a reward transform (nothing to
            bridge), its batch size is not ``(1,)`` or it is not in history mode; if a tool's schema cannot become a signature (naming the tool
            and the field), a tool's name is not an identifier, is a keyword, is taken, or two
            tools share one; if a tool transform reads calls in a syntax that cannot be written;
            if ``processing_class``'s chat template cannot call tools.
        RuntimeError: if an ``MCPToolTransform`` lists no tools (its servers did not connect).

    Examples:
        >>> import inspect
        >>> from torchrl.envs.llm import ChatEnv
        >>> from torchrl.envs.llm.transforms import SimpleToolTransform
        >>> from torchrl_trl_interop.testing import toy_add  # typed, with a Google-style docstring
        >>> def make_calculator():
        ...     env = ChatEnv(batch_size=(1,), input_mode="history")
        ...     return env.append_transform(SimpleToolTransform(tools={"add": toy_add}))
        >>> factory = as_trl_environment_factory(make_calculator)
        >>> factory
        as_trl_environment_factory('calculator', tools=['add'])
        >>> env = factory()  # what GRPOTrainer does, once per rollout
        >>> inspect.signature(env.add)  # what TRL renders into the prompt
        <Signature (*, a: int, b: int) -> int>
        >>> env.reset(prompt=[{"role": "user", "content": "What is 2 plus 3?"}]) is None
        True
        >>> env.add(a=2, b=3)  # the model's tool call, run by the TorchRL environment
        'Tool add executed successfully:\\n5'
        >>> [m["role"] for m in env.messages]
        ['user', 'assistant', 'tool']
        >>> from trl import GRPOConfig, GRPOTrainer  # doctest: +SKIP
        >>> trainer = GRPOTrainer(model, args=GRPOConfig(...), train_dataset=prompts,  # doctest: +SKIP
        ...     environment_factory=factory, reward_funcs=factory.reward_func)
    """
    require("transformers", "as_trl_environment_factory")
    from torchrl.envs import EnvBase

    if isinstance(make_env, EnvBase):
        raise TypeError(
            f"make_env is an environment ({type(make_env).__name__}); pass the function that "
            "builds one instead: TRL builds an instance per concurrent rollout, and "
            "AsyncGRPOTrainer builds them in another process."
        )
    if not callable(make_env):
        raise TypeError(
            "make_env should be a zero-argument callable returning a TorchRL environment (a "
            "module-level function or functools.partial, so it pickles), got "
            f"{type(make_env).__name__}."
        )
    name = _default_name(make_env) if name is None else name
    if not isinstance(name, str) or not name:
        raise TypeError(f"name should be a non-empty str, got {name!r}.")
    rename = as_mapping(rename, "rename", "{tool name: new name}")
    row_keys = None if row_keys is None else list(as_names(row_keys, "row_keys"))
    if row_keys is not None and "prompt" in row_keys:
        raise ValueError("row_keys should not name 'prompt': it resets the ChatEnv.")
    if processing_class is not None:
        check_tool_template(processing_class)
    check_bool(get_reward, "get_reward")
    factory = _EnvironmentFactory(
        make_env,
        name,
        rename,
        row_keys,
        as_nested_key(reward_key, "reward_key"),
        as_nested_key(done_key, "done_key"),
        get_reward,
    )
    factory._spare = factory._make()  # checked now; the first instance TRL asks for uses it
    factory._build_class(factory._spare)
    return factory
