"""Every trainer config the toy fixtures build states fp32, so no run autocasts on any CPU.

TRL's configs default to ``bf16=True`` when ``fp16`` is not set (checked below, so the fixtures'
setting is what stands between a run and bf16 autocast). ``test/conftest.py`` holds every config
the tests build to the same rule, and ``test/test_tutorial.py`` every config the tutorial builds.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from torchrl_trl_interop.testing import toy_grpo_args, toy_tool_grpo_args, toy_trainer_args

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ["SFTConfig", "RewardConfig", "DPOConfig", "GRPOConfig", "RLOOConfig"]
FIXTURES = {
    "toy_trainer_args": toy_trainer_args,
    "toy_grpo_args": toy_grpo_args,
    "toy_tool_grpo_args": toy_tool_grpo_args,
}


def _config(name):
    import trl

    return getattr(trl, name)


@pytest.mark.autocast
@pytest.mark.parametrize("name", CONFIGS)
def test_trl_defaults_to_bf16(name, tmp_path):
    """Why the fixtures state precision: left alone, TRL's configs ask for bf16 autocast."""
    args = _config(name)(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    assert args.bf16 is True and args.fp16 is False


@pytest.mark.parametrize("fixture", ["toy_grpo_args", "toy_tool_grpo_args"])
def test_grpo_fixtures_are_fp32(fixture, tmp_path):
    args = _config("GRPOConfig")(**FIXTURES[fixture](str(tmp_path)))
    assert args.bf16 is False and args.fp16 is False


@pytest.mark.parametrize("name", [*CONFIGS, "TrainingArguments"])
def test_the_caller_states_precision_beside_toy_trainer_args(name, tmp_path):
    """``toy_trainer_args`` leaves the precision to the caller (as before it stated it, so
    scripts written then run): the caller's own ``bf16=``/``fp16=`` beside the splat is no
    duplicate keyword, and one given to the fixture is kept."""
    if name == "TrainingArguments":
        from transformers import TrainingArguments as config
    else:
        config = _config(name)
    extra = {"num_generations": 2} if name in ("GRPOConfig", "RLOOConfig") else {}
    assert not {"bf16", "fp16"} & set(toy_trainer_args(str(tmp_path)))
    args = config(bf16=False, **toy_trainer_args(str(tmp_path)), **extra)
    assert args.bf16 is False and args.fp16 is False
    args = config(**toy_trainer_args(str(tmp_path), bf16=False, fp16=False), **extra)
    assert args.bf16 is False and args.fp16 is False


#: Calls that build a trainer config, and the fixtures whose ``**`` splat states fp32.
TRAINER_CONFIGS = {*CONFIGS, "TrainingArguments"}
FP32_FIXTURES = {"toy_grpo_args", "toy_tool_grpo_args", "run_args", "common_args"}


def _unchecked_configs(path: Path) -> list[str]:
    """Config calls in ``path`` that state no precision: no ``bf16=``, no fixture splat, and no
    ``**name`` built in the same file by a fixture or with a ``bf16`` key."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    fp32_names = set()
    for node in ast.walk(tree):  # names assigned from a fixture call, or a dict with "bf16"
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
            if isinstance(target, ast.Name) and _states_fp32(value):
                fp32_names.add(target.id)
    bad = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        if _called(node) not in TRAINER_CONFIGS:
            continue
        if any(kw.arg == "bf16" for kw in node.keywords):
            continue
        splats = [kw.value for kw in node.keywords if kw.arg is None]
        if any(_states_fp32(v) or (isinstance(v, ast.Name) and v.id in fp32_names) for v in splats):
            continue
        bad.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return bad


def _called(call: ast.Call) -> str:
    """The name a call calls: ``f`` of ``f(...)`` and of ``module.f(...)``."""
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _states_fp32(value: ast.AST) -> bool:
    if isinstance(value, ast.Call):  # a fixture that states it, or one told to
        return _called(value) in FP32_FIXTURES or any(kw.arg == "bf16" for kw in value.keywords)
    if isinstance(value, ast.Dict):
        keys = [k.value for k in value.keys if isinstance(k, ast.Constant)]
        return "bf16" in keys or any(
            _states_fp32(v) for k, v in zip(value.keys, value.values) if k is None
        )
    return False


def test_benchmarks_tutorial_and_tests_state_precision():
    """Every trainer config written in the benchmarks, the tutorial, the tests and the package
    states fp32 where it is built (the runs themselves are checked by conftest and the tutorial
    test; the benchmarks are not run by the suite, so this is their check)."""
    files = [
        *sorted((ROOT / "benchmarks").glob("*.py")),
        *sorted((ROOT / "tutorials").glob("*.py")),
        *sorted((ROOT / "test").rglob("*.py")),
        *sorted((ROOT / "torchrl_trl_interop").rglob("*.py")),
    ]
    bad = [site for path in files for site in _unchecked_configs(path)]
    assert bad == [], f"trainer configs that state no precision: {bad}"
