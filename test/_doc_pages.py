"""The Python blocks of ``docs/*.rst``: found (:func:`blocks_of`) and run once per test session.

A page's blocks (``.. code-block:: python`` and ``::`` literal blocks, which Sphinx highlights as
Python) run in order, in one namespace, in a temporary directory, offline. What a page leaves to
its reader (a tokenizer, a model, a buffer) comes from hidden set-up blocks: rst comments, which
the build does not render, built from the toy fixtures of :mod:`torchrl_trl_interop.testing`::

    .. test-setup:

        from torchrl_trl_interop.testing import toy_tokenizer
        tok = toy_tokenizer()

A block that cannot run here (it needs a GPU, a cluster, a server) follows a comment saying
why; it is still compiled::

    .. skip-test: needs a vLLM server

A page runs once per session (:class:`PageRuns`, the ``doc_pages`` fixture of
``test/conftest.py``): ``test_docs_code.py`` checks that every page runs, and the tests that
check what a page's code does (``test/openenv/test_four_ways.py``,
``test/rollouts/test_env_factory.py``) read the same run: its namespace after each block and
what it printed.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parents[1] / "docs"
PYTHON = {"python", "python3", "py"}
_CODE = re.compile(r"^(\s*)\.\. (?:code-block|code|sourcecode)::\s*(\S*)\s*$")
_SETUP = re.compile(r"^(\s*)\.\. test-setup:\s*$")
_SKIP = re.compile(r"^\s*\.\. skip-test:\s*(\S.*)$")
_LITERAL = re.compile(r"^(\s*)(?!\.\. )\S.*::\s*$")


@dataclass
class Block:
    kind: str  # "code" or "setup"
    line: int  # 1-based line of the first line of code
    source: str
    skip: str | None = None  # why it cannot run here


def _body(lines: list[str], start: int, indent: int) -> tuple[int, str, int]:
    """The indented body after line ``start``: (its first line, its dedented text, next line)."""
    i = start + 1
    while i < len(lines) and lines[i].strip().startswith(":") and not lines[i].strip() == "::":
        i += 1  # directive options (:caption:, :linenos:)
    body_start = i
    body = []
    while i < len(lines) and (
        not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent
    ):
        body.append(lines[i])
        i += 1
    while body and not body[-1].strip():
        body.pop()
    first = next((j for j, text in enumerate(body) if text.strip()), 0)
    return body_start + first + 1, textwrap.dedent("\n".join(body[first:])), i


def blocks_of(text: str, page: str = "page") -> list[Block]:
    """The set-up and Python blocks of an rst text, in order, with the skip reasons."""
    lines = text.splitlines()
    out: list[Block] = []
    skip = None
    i = 0
    while i < len(lines):
        text_line = lines[i]
        code, setup, literal = _CODE.match(text_line), _SETUP.match(text_line), None
        if not (code or setup) and not text_line.lstrip().startswith(".. "):
            literal = _LITERAL.match(text_line)
        if match := _SKIP.match(text_line):
            skip = match.group(1)
            i += 1
            continue
        if code or setup or literal:
            indent = len((code or setup or literal).group(1))
            line, source, i = _body(lines, i, indent)
            if not source.strip():
                pass  # not a block (a paragraph that ends with "::" and nothing indented)
            elif setup:
                out.append(Block("setup", line, source))
            elif literal or (code.group(2) or "python") in PYTHON:
                out.append(Block("code", line, source, skip))
            if skip is not None and not (code or literal):
                raise AssertionError(f"{page}: a skip-test comment must precede a code block")
            if code or literal:
                skip = None
            continue
        if skip is not None and text_line.strip():
            raise AssertionError(f"{page}:{i + 1}: a skip-test comment is not followed by a block")
        i += 1
    return out


@dataclass
class PageRun:
    """One run of a page: its blocks, the namespace after each (a shallow copy), what it printed
    and the error that stopped it (``None``: every block ran)."""

    page: Path
    blocks: list[Block]
    namespaces: list[dict[str, Any]] = field(default_factory=list)
    out: str = ""
    error: BaseException | None = None

    def check(self) -> None:
        """Raises what stopped the run (the test that ran it first saw it too)."""
        if self.error is not None:
            raise AssertionError(f"{self.page.name} did not run: {self.error!r}") from self.error

    def after(self, line: int) -> dict[str, Any]:
        """The namespace after the first block that starts at or after ``line`` of the page."""
        self.check()
        for block, namespace in zip(self.blocks, self.namespaces):
            if block.line >= line:
                return namespace
        raise AssertionError(f"{self.page.name} has no block after line {line}")

    @property
    def namespace(self) -> dict[str, Any]:
        """The namespace after the last block."""
        self.check()
        return self.namespaces[-1] if self.namespaces else {}


class PageRuns:
    """Runs each page once, in a directory of its own under ``root``, and keeps the run."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._runs: dict[str, PageRun] = {}

    def run(self, page: str | Path) -> PageRun:
        page = DOCS / page if isinstance(page, str) else page
        if page.name not in self._runs:
            self._runs[page.name] = self._run(page)
        return self._runs[page.name]

    def _run(self, page: Path) -> PageRun:
        run = PageRun(page, blocks_of(page.read_text(), page.name))
        where = self.root / page.stem
        where.mkdir(parents=True, exist_ok=True)
        namespace: dict[str, Any] = {"__name__": f"docs.{page.stem}"}
        out, cwd = io.StringIO(), os.getcwd()
        os.chdir(where)
        try:
            with contextlib.redirect_stdout(out):
                for block in run.blocks:
                    # blank lines first, so tracebacks give the line of the .rst file
                    code = compile("\n" * (block.line - 1) + block.source, str(page), "exec")
                    if block.skip is None:  # compiled above: a skipped block is still Python
                        exec(code, namespace)
                    run.namespaces.append(dict(namespace))
        except Exception as err:  # kept: every test reading this page reports it
            run.error = err
        finally:
            os.chdir(cwd)
            run.out = out.getvalue()
        return run
