"""Every Python code block of ``docs/*.rst`` runs (issue 20, item 18), once per session.

How blocks are found, set up and skipped: ``test/_doc_pages.py``. Each page runs once per
session (the ``doc_pages`` fixture): the tests that check what a page's code does read the same
run. docutils parses each page too, and must find the same Python blocks: a block written in a
form the parser does not know fails the test instead of being left out.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from _doc_pages import DOCS, PYTHON, blocks_of

PAGES = sorted(DOCS.glob("*.rst"))


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
def test_page_runs(page, doc_pages):
    run = doc_pages.run(page)
    run.check()
    assert len(run.namespaces) == len(run.blocks)
