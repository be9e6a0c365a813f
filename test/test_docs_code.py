"""Every Python code block of ``docs/*.rst`` runs (issue 20, item 18).

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

docutils parses each page too, and must find the same Python blocks: a block written in a form
this parser does not know fails the test instead of being left out.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
PAGES = sorted(DOCS.glob("*.rst"))
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


def docutils_python_blocks(path: Path) -> int:
    """How many Python literal blocks docutils finds in the page (includes followed)."""
    from docutils import nodes
    from docutils.core import publish_doctree

    tree = publish_doctree(
        path.read_text(),
        source_path=str(path),
        settings_overrides={"report_level": 5, "halt_level": 5, "file_insertion_enabled": True},
    )
    count = 0
    for node in tree.findall(nodes.literal_block):
        if isinstance(node.parent, nodes.system_message):
            continue  # the text of a Sphinx directive docutils does not know (toctree...)
        languages = set(node["classes"]) - {"code"}
        count += not languages or bool(languages & PYTHON)
    return count


def test_the_parser_reads_every_form():
    page = textwrap.dedent(
        """\
        Title
        =====

        .. test-setup:

            import os

            tok = "toy"

        .. skip-test: needs a GPU

        .. code-block:: python
           :caption: first

           a = 1

        * item

          .. code-block:: python

              b = a + 1

        .. code-block:: bash

           make test

        Literal::

            c = b + 1

        The end.
        """
    )
    found = blocks_of(page)
    assert [(b.kind, b.line, b.source, b.skip) for b in found] == [
        ("setup", 6, 'import os\n\ntok = "toy"', None),
        ("code", 15, "a = 1", "needs a GPU"),
        ("code", 21, "b = a + 1", None),
        ("code", 29, "c = b + 1", None),
    ]
    with pytest.raises(AssertionError, match="not followed by a block"):
        blocks_of(".. skip-test: why\n\nSome text.\n")


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_docutils_finds_the_same_blocks(page):
    code = [b for b in blocks_of(page.read_text(), page.name) if b.kind == "code"]
    assert len(code) == docutils_python_blocks(page), (
        f"{page.name}: docutils finds another number of Python blocks than this test runs; "
        "write them as `.. code-block:: python` or a `::` literal block"
    )


RUN = [p for p in PAGES if any(b.kind == "code" for b in blocks_of(p.read_text(), p.name))]


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("page", RUN, ids=[p.name for p in RUN])
def test_page_runs(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": f"docs.{page.stem}"}
    for block in blocks_of(page.read_text(), page.name):
        # blank lines first, so tracebacks give the line of the .rst file
        code = compile("\n" * (block.line - 1) + block.source, str(page), "exec")
        if block.skip is not None:
            continue  # compiled above: a skipped block is still valid Python
        exec(code, namespace)
