"""The deprecation policy, checked: every deprecated name warns with its replacement and removal
version, is removed on time, and is in the changelog; the version is one and moves with it."""

from __future__ import annotations

import importlib
import re
import warnings
from pathlib import Path

import pytest
from packaging.version import Version

import torchrl_trl_interop
from torchrl_trl_interop._deprecation import DEPRECATED, deprecation_message

ROOT = Path(__file__).resolve().parents[1]
CHANGELOG = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
ATTRIBUTES = sorted(name for name, entry in DEPRECATED.items() if entry.home is not None)


def test_every_deprecated_name_is_still_ahead_of_its_removal():
    """A name whose removal version the package has reached must go now (and the changelog's
    "Removed" say so)."""
    version = Version(torchrl_trl_interop.__version__)
    due = [name for name, entry in DEPRECATED.items() if version >= Version(entry.removed_in)]
    assert due == [], f"remove these now: {due}"


@pytest.mark.parametrize("qualname", sorted(DEPRECATED))
def test_the_changelog_lists_every_deprecation(qualname):
    unreleased = CHANGELOG.split("## [Unreleased]", 1)[1].split("\n## [", 1)[0]
    deprecated = unreleased.split("### Deprecated", 1)[1].split("\n### ", 1)[0]
    short = qualname.removeprefix("torchrl_trl_interop.")
    assert f"`{short}" in deprecated
    assert f"removed in {DEPRECATED[qualname].removed_in}" in deprecated


@pytest.mark.parametrize("qualname", ATTRIBUTES)
def test_a_deprecated_attribute_warns_and_is_served(qualname):
    """Read as the code written against the release that had it reads it: the warning names the
    replacement and the removal version, and points at the reading line."""
    package, name = qualname.rsplit(".", 1)
    module = importlib.import_module(package)
    with pytest.warns(DeprecationWarning) as caught:
        value = getattr(module, name)
    assert str(caught[0].message) == deprecation_message(qualname)
    assert DEPRECATED[qualname].replacement in str(caught[0].message)
    assert caught[0].filename == __file__
    assert value is getattr(importlib.import_module(DEPRECATED[qualname].home), name)
    assert name not in module.__all__  # a star import does not warn for every one of them


def test_free_port_and_scripted_episode_still_work():
    """The two the new user's scripts used, imported and run as they were."""
    from torchrl_trl_interop import as_trl_environment_factory

    with pytest.warns(DeprecationWarning, match=r"testing\.free_port .*removed in 0\.3\.0"):
        from torchrl_trl_interop.testing import free_port
    with pytest.warns(DeprecationWarning, match=r"testing\.scripted_episode .*removed in 0\.3"):
        from torchrl_trl_interop.testing import scripted_episode, toy_calculator_env
    assert 1024 <= free_port() < 65536
    call = {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}
    out = scripted_episode(
        as_trl_environment_factory(toy_calculator_env),
        [{"role": "user", "content": "What is 2 plus 3?"}],
        [
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "assistant", "content": "2 plus 3 is 5."},
        ],
    )
    assert out["reward"] == 1.0 and out["completion"][1]["role"] == "tool"


def test_an_unknown_testing_name_is_an_attribute_error():
    import torchrl_trl_interop.testing as testing

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no deprecation warning on the way to the error
        with pytest.raises(AttributeError, match="has no attribute 'toy_nothing'"):
            testing.toy_nothing  # noqa: B018


def test_the_version_is_one_and_moves_with_the_changelog():
    """``pyproject.toml`` reads ``__version__`` (the wheel's metadata: ``test_packaging.py``);
    with changes not yet released it is a ``.dev`` of a version past the last release."""
    tomllib = pytest.importorskip("tomllib")
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "version" not in pyproject["project"] and "version" in pyproject["project"]["dynamic"]
    attr = pyproject["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "torchrl_trl_interop.__version__"

    version = Version(torchrl_trl_interop.__version__)
    releases = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}", CHANGELOG, flags=re.M)
    assert releases, "no released version in CHANGELOG.md"
    latest = Version(releases[0])
    assert releases == sorted(releases, key=Version, reverse=True)
    if "## [Unreleased]" in CHANGELOG:
        assert version.is_devrelease and version > latest, (version, latest)
    else:
        assert version == latest
