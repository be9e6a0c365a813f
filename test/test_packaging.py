"""The sdist and the wheel: LICENSE in both, the sdist carries what the tests need, the wheel's
version is the package's.

Both are built offline with setuptools' own PEP 517 backend (what ``python -m build`` calls),
from a copy of the project so that the checkout gets no ``build/`` or ``*.egg-info``.
"""

from __future__ import annotations

import email
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import torchrl_trl_interop

ROOT = Path(__file__).resolve().parents[1]
BUILD = (
    "import setuptools.build_meta as backend; "
    "backend.build_sdist('dist'); backend.build_wheel('dist')"
)


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> tuple[Path, Path]:
    pytest.importorskip("setuptools", minversion="77")
    src = tmp_path_factory.mktemp("src") / "project"
    ignore = shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "_build", "auto_examples"
    )
    shutil.copytree(ROOT, src, ignore=ignore)
    out = subprocess.run(
        [sys.executable, "-c", BUILD], cwd=src, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    (sdist,) = (src / "dist").glob("*.tar.gz")
    (wheel,) = (src / "dist").glob("*.whl")
    return sdist, wheel


def test_sdist_carries_the_license_and_what_the_tests_need(dists):
    with tarfile.open(dists[0]) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    tests = {p.relative_to(ROOT).as_posix() for p in (ROOT / "test").rglob("*.py")}
    needed = {
        "LICENSE",
        "README.md",
        "CHANGELOG.md",
        "pyproject.toml",
        "test/conftest.py",
        "test/data/_torchrun_worker.py",
        "test/data/_resume_worker.py",
        "tutorials/trl_interop.py",
        "tutorials/README.txt",
        "docs/conf.py",
        "docs/index.rst",
        "torchrl_trl_interop/py.typed",
        *tests,
    }
    assert needed <= names, sorted(needed - names)
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)


def test_wheel_carries_the_license_and_spdx_metadata(dists):
    with zipfile.ZipFile(dists[1]) as whl:
        names = whl.namelist()
        info = next(n.rsplit("/", 1)[0] for n in names if n.endswith(".dist-info/METADATA"))
        metadata = email.message_from_bytes(whl.read(f"{info}/METADATA"))
    assert f"{info}/licenses/LICENSE" in names
    assert metadata["License-Expression"] == "MIT"
    assert metadata["Version"] == torchrl_trl_interop.__version__  # the one version
    assert dists[1].name.startswith(f"torchrl_trl_interop-{torchrl_trl_interop.__version__}-")
    assert metadata.get_all("License-File") == ["LICENSE"]
    assert "torchrl_trl_interop/py.typed" in names
    assert not any(n.startswith(("test/", "docs/", "tutorials/")) for n in names)


def test_installed_versions_lie_in_the_declared_ranges():
    """The ranges in ``pyproject.toml`` are the ones CI tests: the versions this run tests (the
    set-up installs the newest each range allows) satisfy every range of the core and the extras
    the suite installs."""
    tomllib = pytest.importorskip("tomllib")
    from importlib import metadata

    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = project["optional-dependencies"]
    declared = [*project["dependencies"], *extras["hf"], *extras["ray"], *extras["openenv"]]
    declared += [r for r in extras["test"] if not r.startswith("torchrl-trl-interop")]
    outside = []
    for line in declared:
        requirement = Requirement(line)
        version = metadata.version(requirement.name)
        if not requirement.specifier.contains(version, prereleases=True):
            outside.append(f"{requirement.name} {version} not in {requirement.specifier}")
    assert outside == []
