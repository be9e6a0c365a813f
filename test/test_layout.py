"""The package's layout stays as ``docs/overview.rst`` states it.

The overview's module table lists every module of the package, its numbered layers say which way
imports run, and no module imports a module of a later layer or closes an import cycle.
Function-level imports count too: an import hidden in a function is still a dependency.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "torchrl_trl_interop"
OVERVIEW = (ROOT / "docs" / "overview.rst").read_text()


def module_names() -> dict[str, Path]:
    """``{"data._dataset": path, "_keys": path, "testing": path, ...}`` (``__init__`` as its package)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def layers() -> list[list[str]]:
    """The numbered list of the overview: each item's ``name`` or ``folder/`` entries."""
    items = re.findall(r"^  \d+\. (.+)$", OVERVIEW, flags=re.M)
    assert items, "docs/overview.rst lost its numbered list of import layers"
    return [re.findall(r"``([\w/]+)``", item.split(":")[0]) for item in items]


def layer_of(module: str, order: list[list[str]]) -> int:
    top = module.split(".")[0]
    for i, names in enumerate(order):
        if top in names or f"{top}/" in names:
            return i
    raise AssertionError(f"module {module!r} belongs to no layer of docs/overview.rst")


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """The package modules ``module`` imports (relative imports, at any depth of the file)."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level == 0:
            if node.module and node.module.startswith("torchrl_trl_interop."):
                base = node.module.removeprefix("torchrl_trl_interop.").split(".")
            else:
                continue
        else:
            base = package[: len(package) - node.level + 1] + (
                node.module.split(".") if node.module else []
            )
        target = ".".join(base)
        if target in known:
            out.add(target)
        for alias in node.names:  # `from . import x`, `from .data import _dataset`
            sub = ".".join([*base, alias.name])
            if sub in known:
                out.add(sub)
    out.discard(module)
    return out


MODULES = module_names()
GRAPH = {m: imports_of(m, p, set(MODULES)) for m, p in MODULES.items()}


def test_the_map_lists_every_module():
    listed = set(re.findall(r"^   \* - ``([\w/]+)``$", OVERVIEW, flags=re.M))
    expected = {m.replace(".", "/") for m in MODULES if not m.startswith("testing")}
    expected -= {m for m in ("data", "rewards", "weights", "rollouts", "openenv") if m in expected}
    expected.add("testing")
    expected.discard("")  # the top-level __init__: the public face, described above the table
    assert listed == expected, (
        f"docs/overview.rst's table and the package differ: missing {sorted(expected - listed)}, "
        f"gone {sorted(listed - expected)}"
    )


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m))
def test_imports_run_down_the_layers(module):
    order = layers()
    mine = layer_of(module, order)
    for target in sorted(GRAPH[module]):
        theirs = layer_of(target, order) if target else -1
        assert theirs <= mine, f"{module} (layer {mine + 1}) imports {target} (layer {theirs + 1})"
        if mine == 0:
            raise AssertionError(f"the ground helper {module} imports {target}")


def test_no_import_cycle():
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in GRAPH[node]:
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt) :] + [nxt] if nxt in path else [node, nxt]
                raise AssertionError(f"import cycle: {' -> '.join(cycle)}")
            if nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for module in GRAPH:
        if module not in state:
            visit(module, [module])


def test_implementation_files_are_private():
    """A module without a leading underscore is one users import from: only the public faces."""
    public = sorted(
        m for m in MODULES if m and not any(part.startswith("_") for part in m.split("."))
    )
    assert public == ["data", "openenv", "rewards", "rollouts", "testing", "weights"]


def test_only_rollouts_trainer_reads_a_trl_trainer():
    """``rollouts/_trainer.py`` is the one reader of a TRL trainer (issue 36): no other module
    reads a private attribute of an object named like a trainer (``trainer``, ``self.trainer``,
    ``grpo_trainer``...), as ``trainer._x``, ``getattr(trainer, "_x")``, ``hasattr``/``setattr``,
    nor, outside ``testing/`` (whose fixtures build trainers), any attribute of one."""
    named = re.compile(r"(^|_)trainer$")

    def is_trainer(node: ast.AST) -> bool:
        name = getattr(node, "id", None) if isinstance(node, ast.Name) else None
        if isinstance(node, ast.Attribute):
            name = node.attr
        return bool(name and named.search(name))

    def reads(tree: ast.AST):
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and is_trainer(node.value):
                yield node.lineno, node.attr
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in {"getattr", "hasattr", "setattr", "delattr"}
                and len(node.args) >= 2
                and is_trainer(node.args[0])
            ):
                key = node.args[1]
                yield node.lineno, key.value if isinstance(key, ast.Constant) else "<computed>"

    private, public = [], []
    for module, path in MODULES.items():
        if module == "rollouts._trainer":
            continue
        for line, attr in reads(ast.parse(path.read_text())):
            where = f"{path.relative_to(ROOT)}:{line} .{attr}"
            if (attr.startswith("_") and not attr.startswith("__")) or attr == "<computed>":
                private.append(where)
            elif not module.startswith("testing"):
                public.append(where)
    assert not private, f"a TRL trainer's private attributes read elsewhere: {private}"
    assert not public, f"a TRL trainer read outside rollouts/_trainer.py: {public}"
