"""Tool signatures TRL can render: JSON schemas and Python callables → one :class:`ToolSignature`.

TRL renders a tool for the model with ``transformers.utils.get_json_schema``, which reads a
function's type hints (``__annotations__``: a ``__signature__`` alone gives an empty schema) and
its Google-style docstring (one line per argument). TorchRL's tools describe themselves in other
ways: a ``SimpleToolTransform`` holds plain callables (and optional ``tool_schemas``), a
``ToolRegistry`` service has a ``schema_in``, an MCP server lists JSON schemas. This module turns
each into a :class:`ToolSignature` (keyword-only parameters, annotations, docstring) and builds
functions that carry it; :func:`check_renders` proves ``get_json_schema`` accepts the result.
"""

from __future__ import annotations

import inspect
import keyword
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Union

__all__ = [
    "ToolSignature",
    "check_renders",
    "function_with_signature",
    "signature_from_callable",
    "signature_from_schema",
]

_JSON_TYPES: dict[str, Any] = {
    "integer": int,
    "number": float,
    "string": str,
    "boolean": bool,
    "null": type(None),
    "array": list,
    "object": dict,
}
# property keywords a signature cannot hold but the model should read: kept in the description
_NOTED = (
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "uniqueItems",
    "examples",
)
_READ = {"type", "description", "default", "enum", "const", "items", "anyOf", "nullable"}
_READ |= {"additionalProperties", "title"}
_TOP_LEVEL = {"type", "properties", "required", "title", "description", "$schema"}
_TOP_LEVEL |= {"additionalProperties"}
_NO_DEFAULT = inspect.Parameter.empty


@dataclass(frozen=True)
class ToolSignature:
    """What TRL renders of one tool: its name, keyword-only parameters, hints and docstring.

    ``annotations`` holds a ``"return"`` hint when the tool's function has one
    (``get_json_schema`` renders it as the schema's ``return`` entry); ``is_async`` marks a
    coroutine function (TRL awaits it).
    """

    name: str
    parameters: tuple[inspect.Parameter, ...]
    annotations: dict[str, Any]
    doc: str
    is_async: bool = False

    @property
    def signature(self) -> inspect.Signature:
        returns = self.annotations.get("return", inspect.Signature.empty)
        return inspect.Signature(list(self.parameters), return_annotation=returns)


def _google_doc(description: str, args: Mapping[str, str]) -> str:
    """A Google-style docstring: the description, then one ``name: text`` line per argument."""
    lines = [description.strip() or "A tool."]
    if args:
        lines += ["", "Args:"]
        lines += [f"    {name}: {' '.join(text.split()) or name}" for name, text in args.items()]
    return "\n".join(lines) + "\n"


def _parameter(tool: str, field: str, default: Any, hint: Any) -> inspect.Parameter:
    if not field.isidentifier() or keyword.iskeyword(field):
        raise ValueError(
            f"tool {tool!r} has an argument {field!r}, which is not a Python identifier (or is "
            "a keyword), so it cannot be a parameter of the tool's signature. Rename the "
            "argument in the tool's schema."
        )
    return inspect.Parameter(
        field, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=hint
    )


def _hint(tool: str, field: str, schema: Any) -> Any:
    """The type hint ``get_json_schema`` turns back into ``schema`` (a JSON-schema property)."""
    if isinstance(schema, type) or schema is Any or typing.get_origin(schema) is not None:
        return schema  # already a hint, as ToolRegistry's ``schema_in = {"a": int}`` writes it
    if isinstance(schema, str):
        schema = {"type": schema}
    if not isinstance(schema, Mapping):
        raise TypeError(
            f"tool {tool!r}, argument {field!r}: expected a JSON-schema property (a dict such "
            f"as {{'type': 'integer'}}) or a Python type, got {schema!r:.100}."
        )
    unknown = sorted(set(schema) - _READ - set(_NOTED))
    if unknown:
        raise ValueError(
            f"tool {tool!r}, argument {field!r}: its schema uses {unknown}, which a Python "
            "signature cannot express (nested objects, references, combinations; supported: "
            "type, enum, const, items, anyOf, additionalProperties, description, default). "
            "Simplify the schema."
        )
    if "enum" in schema or "const" in schema:
        values = schema["enum"] if "enum" in schema else [schema["const"]]
        hint: Any = Literal[tuple(values)]
    elif "anyOf" in schema:
        hint = Union[tuple(_hint(tool, field, s) for s in schema["anyOf"])]  # noqa: UP007
    elif "type" not in schema:
        hint = Any
    else:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        bad = next((t for t in types if t not in _JSON_TYPES), None)
        if bad is not None:
            raise ValueError(
                f"tool {tool!r}, argument {field!r} has type {bad!r}; expected one of the "
                f"JSON-schema types {sorted(_JSON_TYPES)}."
            )
        hints = [_container_hint(tool, field, t, schema) for t in types]
        hint = hints[0] if len(hints) == 1 else Union[tuple(hints)]  # noqa: UP007
    if schema.get("nullable"):
        hint = typing.Optional[hint]  # noqa: UP045
    return hint


def _container_hint(tool: str, field: str, json_type: str, schema: Mapping) -> Any:
    if json_type == "array" and "items" in schema:
        return list[_hint(tool, f"{field}[]", schema["items"])]
    extra = schema.get("additionalProperties")
    if json_type == "object" and isinstance(extra, Mapping) and extra:
        return dict[str, _hint(tool, f"{field}{{}}", extra)]
    return _JSON_TYPES[json_type]


def _described(schema: Any) -> str:
    """A property's description, with the constraints a signature cannot hold appended."""
    if not isinstance(schema, Mapping):
        return ""
    notes = [f"{k}: {schema[k]!r}" for k in _NOTED if k in schema]
    text = str(schema.get("description") or "").strip()
    return f"{text} ({', '.join(notes)})".strip() if notes else text


def signature_from_schema(
    name: str, schema: Mapping[str, Any], *, description: str | None = None
) -> ToolSignature:
    """A tool's signature from a JSON schema: an OpenAI-style function (``{"name",
    "description", "parameters"}``), an object schema (``{"type": "object", "properties",
    "required"}``), or a flat ``{argument: type or property schema}`` mapping (a ``ToolRegistry``
    service's ``schema_in``, whose arguments are all required).

    Raises:
        TypeError: if ``schema`` is not a mapping, or a property is neither a schema nor a type.
        ValueError: naming the tool and the field, if the schema uses what a Python signature
            cannot express (``$ref``, ``oneOf``, ``allOf``, nested objects...), or an argument's
            name is not an identifier.

    Examples:
        >>> sig = signature_from_schema("add", {"type": "object", "properties": {
        ...     "a": {"type": "integer", "description": "first"}, "b": {"type": "integer"}},
        ...     "required": ["a"]})
        >>> sig.signature
        <Signature (*, a: int, b: int = None)>
    """
    if not isinstance(schema, Mapping):
        raise TypeError(
            f"the schema of tool {name!r} should be a dict (a JSON schema), got "
            f"{type(schema).__name__}."
        )
    if "parameters" in schema:  # an OpenAI-style function: {"name", "description", "parameters"}
        description = description or schema.get("description")
        schema = schema["parameters"]
    if schema.get("type") == "object" or "properties" in schema:
        unknown = sorted(set(schema) - _TOP_LEVEL)
        if unknown:
            raise ValueError(
                f"the schema of tool {name!r} uses {unknown}, which a Python signature cannot "
                "express (conditional or combined requirements, references). Simplify the "
                "schema (a flat 'properties' with 'required')."
            )
        properties = dict(schema.get("properties") or {})
        required = set(schema.get("required") or [])
        description = description or schema.get("description")
    else:  # {argument: type or property schema}, all required
        properties, required = dict(schema), set(schema)
    parameters, annotations, docs = [], {}, {}
    for field, prop in properties.items():
        default = _NO_DEFAULT if field in required else None
        if isinstance(prop, Mapping) and "default" in prop:
            default = prop["default"]
        annotations[field] = _hint(name, field, prop)
        parameters.append(_parameter(name, field, default, annotations[field]))
        docs[field] = _described(prop) or f"The {field} argument."
    return ToolSignature(name, tuple(parameters), annotations, _google_doc(description or "", docs))


def signature_from_callable(name: str, func: Callable) -> ToolSignature:
    """A tool's signature read from a Python callable's own signature, hints and docstring.

    Raises:
        TypeError: if ``func`` takes ``*args``/``**kwargs`` or an argument has no type hint.
        ValueError: if it has no docstring (``get_json_schema`` needs one, with every argument).

    The function's return hint is kept (``get_json_schema`` renders it, with the docstring's
    ``Returns:`` section, as the schema's ``return`` entry), and so is whether it is a coroutine
    function.

    Examples:
        >>> from torchrl_trl_interop.testing import toy_add
        >>> sig = signature_from_callable("add", toy_add)
        >>> sig.signature, sig.doc.splitlines()[0]
        (<Signature (*, a: int, b: int) -> int>, 'Adds two whole numbers.')
    """
    try:
        hints = typing.get_type_hints(func)
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError, NameError) as err:
        raise TypeError(
            f"cannot read the signature of tool {name!r} ({func!r:.100}): {err}"
        ) from err
    parameters, annotations = [], {}
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError(
                f"tool {name!r} takes {'*' if p.kind == p.VAR_POSITIONAL else '**'}{p.name}; "
                "TRL calls a tool with the named arguments of its schema. Give it named "
                "parameters, or describe it with a schema (SimpleToolTransform's "
                "tool_schemas)."
            )
        if p.name not in hints:
            raise TypeError(
                f"argument {p.name!r} of tool {name!r} has no type hint; TRL renders the "
                f"tool's schema from its hints. Annotate it (e.g. '{p.name}: int'), or "
                "describe the tool with a schema (SimpleToolTransform's tool_schemas)."
            )
        annotations[p.name] = hints[p.name]
        parameters.append(_parameter(name, p.name, p.default, hints[p.name]))
    doc = inspect.getdoc(func)
    if not doc:
        raise ValueError(
            f"tool {name!r} ({func!r:.100}) has no docstring; TRL renders its description from "
            "a Google-style docstring with an 'Args:' line per argument."
        )
    if "return" in hints:
        annotations["return"] = hints["return"]
    is_async = inspect.iscoroutinefunction(func)
    return ToolSignature(name, tuple(parameters), annotations, doc, is_async)


def function_with_signature(body: Callable[..., Any], sig: ToolSignature, *, method: bool) -> Any:
    """A new function named ``sig.name`` that calls ``body(*receiver, **arguments)`` and carries
    ``sig``: ``__signature__``, ``__annotations__``, ``__doc__`` (a ``self`` first if ``method``).
    When ``sig.is_async``, it is a coroutine function awaiting ``body`` (which then returns an
    awaitable), as TRL awaits a plain coroutine function."""

    if sig.is_async and method:

        async def tool(self, **arguments):
            return await body(self, **arguments)

        receiver = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    elif sig.is_async:

        async def tool(**arguments):
            return await body(**arguments)

        receiver = []
    elif method:

        def tool(self, **arguments):
            return body(self, **arguments)

        receiver = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    else:

        def tool(**arguments):
            return body(**arguments)

        receiver = []
    tool.__name__ = tool.__qualname__ = sig.name
    tool.__doc__ = sig.doc
    tool.__annotations__ = dict(sig.annotations)
    tool.__signature__ = sig.signature.replace(parameters=[*receiver, *sig.parameters])
    return tool


def check_renders(func: Callable) -> dict:
    """``transformers.utils.get_json_schema(func)``: what TRL renders; our error if it cannot.

    Raises:
        ValueError: naming the tool, if ``get_json_schema`` refuses it (a hint it cannot map, an
            argument without a line in the docstring).
    """
    from transformers.utils import get_json_schema
    from transformers.utils.chat_template_utils import (
        DocstringParsingException,
        TypeHintParsingException,
    )

    try:
        return get_json_schema(func)
    except (DocstringParsingException, TypeHintParsingException) as err:
        raise ValueError(
            f"TRL cannot render tool {func.__name__!r} for the model "
            f"(transformers.utils.get_json_schema: {err}). Give every argument a JSON-able "
            "type hint and a line in the docstring's 'Args:' section."
        ) from err
