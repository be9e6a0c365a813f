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
    folders = ("data", "rewards", "weights", "rollouts", "openenv", "agents")
    expected -= {m for m in folders if m in expected}
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
    assert public == ["agents", "data", "openenv", "rewards", "rollouts", "testing", "weights"]


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


# -- other libraries' internals: one door -------------------------------------------------------
UPSTREAM = "_upstream"
#: private names of the package's own objects, read across its modules
OWN_PRIVATE = {
    "_commit_log": "CommittedWriter's seqlock counters, read by data/_committed and _buffer_files",
    "_parent_rank": "TorchRLBufferDataset's pickled state (a key of its own __getstate__)",
    "_is_leaf": "the package's own helper in _keys",
    "_sessions": "OpenEnvChatEnv's own sessions",
    "_release": "OpenEnvChatEnv's own release",
    "_generate_step": "TrainerModelPolicy's generate step (_upstream/_policy_hooks installs it)",
    "_shared_env": "as_openenv_environment's own shared environment",
    "_make_env": "as_openenv_environment's own factory",
    "_owns": "as_openenv_environment's own episode ownership",
    "_done": "as_openenv_environment's own episode state",
    "_done_key": "as_openenv_environment's own keys",
    "_reward_key": "as_openenv_environment's own keys",
    "_close": "the environment factory's own instances",
    "_token": "the environment factory's own instances",
    "_tools": "the environment factory's own tool list",
    "_spare": "the environment factory's own spare instance",
    "_acall_tool": "the environment factory's own tool call (async)",
    "_call_tool": "the environment factory's own tool call",
    "_make": "the environment factory's own builder",
    "_build_class": "the environment factory's own class builder",
    "_columns": "the environment factory's own row columns",
    "_factory": "the environment factory's own instances' factory",
    "_actors": "RayRemotePolicy's own actors (read by its staging channel)",
    "_layout": "RemotePolicy's and RayRemotePolicy's own weight layout",
    "_dtypes": "RayRemotePolicy's own weight dtypes (read by its channel)",
    "_encoder": "StagingWeightSyncScheme's own delta encoder (a key of its own __getstate__)",
    "_start": "RemotePolicy's and RayRemotePolicy's own start",
    "_wait": "RayRemotePolicy's own bounded wait",
    "_channel": "StagingWeightSyncScheme's own channel",
    "_live": "StagingWeightSyncScheme's own liveness",
    "_check_alive": "RemotePolicy's own liveness check",
    "_process": "RemotePolicy's own generator process",
    "_reply": "RemotePolicy's own reply queue",
    "_requests": "RemotePolicy's own request queue",
    "_stagings": "RemotePolicy's own staging buffers",
}
#: private names of libraries other than torchrl and tensordict: other doors, not this one
OTHER_LIBRARIES = {
    "_metrics": "TRL trainer (issue 36: one TRL adapter)",
    "_log_metric": "TRL trainer (issue 36: one TRL adapter)",
    "_dist": "TRL trainer (issue 36: one TRL adapter)",
    "_tokenizer": "TRL trainer (issue 36: one TRL adapter)",
    "_last_loaded_step": "TRL trainer (issue 36: one TRL adapter)",
    "_shared_state": "accelerate's PartialState",
    "_modules": "torch.nn.Module",
    "_name_or_path": "transformers' PretrainedConfig",
    "_decode": "transformers' TokenizersBackend (a tokenizer keeping its own decode)",
    "_encode_plus": "transformers' TokenizersBackend (a tokenizer keeping its own call)",
    "_switch_to_input_mode": "transformers' tokenizers with a target mode (they keep their call)",
    "_exit": "os",
    "_message_timeout": "OpenEnv's client",
    "_shared_session_executor": "OpenEnv's HTTPEnvServer (openenv/_step_executor, gated on its version)",
}
#: torchrl's documented extension points: a subclass is meant to override them
EXTENSION_POINTS = {
    "_call",
    "_step",
    "_reset",
    "_set_seed",
    "_apply_transform",
    # torchrl.weight_update.WeightSyncScheme's subclass hooks (what its own schemes override)
    "_init_on_sender_impl",
    "_init_on_receiver_impl",
    "_setup_connection_and_weights_on_sender_impl",
    "_setup_connection_and_weights_on_receiver_impl",
}
#: modules (or folders) whose torchrl reads move in another part of issue 36 (into
#: ``_upstream/_tools``, or later), and reads left with their reason; each entry says which
NOT_YET: dict[str, str] = {}


def _private(name: object) -> bool:
    return isinstance(name, str) and name.startswith("_") and not name.startswith("__")


def _upstream_bases(tree: ast.Module) -> dict[str, tuple[str, str]]:
    """``{local name: (module, name)}`` of the names a file imports from torchrl or tensordict."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] in ("torchrl", "tensordict"):
                for alias in node.names:
                    out[alias.asname or alias.name] = (node.module, alias.name)
    return out


def private_reads(path: Path) -> list[tuple[int, str]]:
    """``(line, name)`` of every private name a module reads on objects not its own: attributes
    (``x._name``, ``getattr(x, "_name")``, ``d["_name"]``), private names imported from torchrl
    or tensordict, reads on ``self`` of names its classes never assign, and private methods of a
    torchrl/tensordict base that its classes override."""
    import importlib

    tree = ast.parse(path.read_text())
    bases = _upstream_bases(tree)
    assigned = {
        t.attr
        for node in ast.walk(tree)
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign))
        for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
    }
    own_defs = {
        n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
    }
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            value = node.value
            if isinstance(value, ast.Name) and value.id in ("self", "cls"):
                if node.attr in assigned or node.attr in own_defs:
                    continue
            out.append((node.lineno, node.attr))
        elif isinstance(node, ast.Call) and len(node.args) >= 2:
            # getattr(x, "_name"), hasattr, setattr, and any helper given an object and a name
            target, name = node.args[0], node.args[1]
            own = isinstance(target, ast.Name) and target.id == "self"
            if isinstance(name, ast.Constant) and _private(name.value) and not own:
                out.append((node.lineno, name.value))
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            if _private(node.slice.value):
                out.append((node.lineno, node.slice.value))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] in ("torchrl", "tensordict"):
                out += [(node.lineno, a.name) for a in node.names if _private(a.name)]
        elif isinstance(node, ast.ClassDef):
            for base in node.bases:
                if not (isinstance(base, ast.Name) and base.id in bases):
                    continue
                module, name = bases[base.id]
                upstream = getattr(importlib.import_module(module), name)
                for item in node.body:
                    if (
                        isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                        and _private(item.name)
                        and item.name not in EXTENSION_POINTS
                        and hasattr(upstream, item.name)
                    ):
                        out.append((item.lineno, item.name))
    return sorted(set(out))


def test_private_reads_of_torchrl_and_tensordict_only_behind_the_door():
    """A private attribute of torchrl or tensordict is read only in ``_upstream/`` (the names of
    the package's own objects and of other libraries are listed above, with their owner)."""
    found = []
    for module, path in MODULES.items():
        rel = str(path.relative_to(PACKAGE))
        later = any(rel == k or (k.endswith("/") and rel.startswith(k)) for k in NOT_YET)
        if module.split(".")[0] == UPSTREAM or later or module.startswith("testing"):
            continue
        for line, name in private_reads(path):
            if name not in OWN_PRIVATE and name not in OTHER_LIBRARIES:
                found.append(f"torchrl_trl_interop/{rel}:{line}: {name}")
    assert not found, (
        "private attributes read outside torchrl_trl_interop/_upstream/ (move the read into an "
        "_upstream module behind its version gate, or list the name as the package's own):\n"
        + "\n".join(found)
    )


def _declared(module: str) -> tuple[str, ...]:
    import importlib

    return tuple(getattr(importlib.import_module(f"torchrl_trl_interop.{module}"), "READS", ()))


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith(f"{UPSTREAM}.")))
def test_each_upstream_module_declares_the_internals_it_reads(module):
    """Each ``_upstream`` module's ``READS`` names what its code reads (its last part, the
    private name), and ``docs/overview.rst``'s table row of the module lists each name."""
    declared = _declared(module)
    in_code = {name for _, name in private_reads(MODULES[module]) if name not in OWN_PRIVATE}
    names = {entry.rsplit(".", 1)[-1] for entry in declared}
    assert names == in_code, (
        f"{module}.READS and its code differ: declared but not read {sorted(names - in_code)}, "
        f"read but not declared {sorted(in_code - names)}"
    )
    assert all(entry.split(".")[0] in ("torchrl", "tensordict") for entry in declared), declared
    row = re.search(
        rf"^   \* - ``{module.replace('.', '/')}``\n((?:     .*\n)+)", OVERVIEW, flags=re.M
    )
    assert row, f"docs/overview.rst has no row for {module}"
    text = row.group(1).replace("\n", " ")
    missing = sorted(n for n in names if not re.search(rf"[`.]{n}``", text))
    assert not missing, f"docs/overview.rst's row of {module} does not list {missing}"


def test_every_speed_path_has_its_gate():
    """Each ``_upstream`` module that reads an internal asks its version gate."""
    for module, path in MODULES.items():
        if module.startswith(f"{UPSTREAM}.") and _declared(module):
            assert "use_fast(" in path.read_text(), f"{module} reads internals with no gate"
