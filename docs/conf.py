"""Sphinx configuration: API reference, the executed sphinx-gallery tutorial, and the guides.

The site uses ``pydata_sphinx_theme`` (the base of the PyTorch ecosystem's theme, which TorchRL and
tensordict use) in PyTorch orange (``_static/custom.css``), copy buttons on code blocks, and links
into the docs of torch, tensordict, torchrl, transformers, trl and datasets through intersphinx
(see ``_intersphinx_mapping`` below for how that behaves offline). The theme loads nothing from
third-party hosts. ``make docs`` builds it with warnings as errors.
"""

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MPLBACKEND", "Agg")

import torchrl_trl_interop

project = "torchrl-trl-interop"
author = "torchrl-trl-interop developers"
copyright = "2026, torchrl-trl-interop developers"
version = release = torchrl_trl_interop.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.intersphinx",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "sphinx_copybutton",
    "sphinx_gallery.gen_gallery",
]

autosummary_generate = True
autodoc_typehints = "description"
# Types go next to the documented arguments only; without this, arguments documented under
# "Keyword Args:" were listed a second time, empty, under "Parameters:".
autodoc_typehints_description_target = "documented"
# "On this page" lists members as ``as_hf_dataset()``, not ``TorchRLBufferDataset.as_hf_dataset()``.
toc_object_entries_show_parents = "hide"
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "show-inheritance": False}
napoleon_google_docstring = True
napoleon_custom_sections = [("Keyword Args", "params_style")]
nitpicky = False

# -- Intersphinx, offline ------------------------------------------------------------------------
# Links such as :class:`torch.Tensor` or :class:`~torchrl.data.ReplayBuffer` resolve through each
# project's ``objects.inv``. Sphinx downloads those inventories at build time; this project builds
# its docs offline (CI has no network beyond package registries, and no installed package ships
# these inventories), and an unreachable inventory is a warning, which ``-W`` turns into a failed
# build. So a project is linked only when its inventory is available:
#
# * ``docs/_inventories/<name>.inv`` — a copy of ``<url>objects.inv`` shipped in the repository
#   (none is shipped today: they could not be downloaded where this was written; drop one in to
#   enable that project offline, e.g. ``curl -o docs/_inventories/torch.inv
#   https://docs.pytorch.org/docs/stable/objects.inv``);
# * or, when ``TORCHRL_TRL_DOCS_ONLINE=1`` is set, the live inventory at ``<url>``.
#
# Otherwise the mapping is left out and such a reference renders as plain code text (``nitpicky``
# is off, so that is not a warning). ``make docs`` prints which projects are linked.
_INTERSPHINX_URLS = {
    "python": "https://docs.python.org/3/",
    "torch": "https://docs.pytorch.org/docs/stable/",
    "tensordict": "https://docs.pytorch.org/tensordict/stable/",
    "torchrl": "https://docs.pytorch.org/rl/stable/",
    "transformers": "https://huggingface.co/docs/transformers/main/en/",
    "trl": "https://huggingface.co/docs/trl/main/en/",
    "datasets": "https://huggingface.co/docs/datasets/main/en/",
}
_ONLINE = os.environ.get("TORCHRL_TRL_DOCS_ONLINE", "") == "1"


def _intersphinx_mapping() -> dict[str, tuple[str, str | None]]:
    mapping = {}
    for name, url in _INTERSPHINX_URLS.items():
        local = DOCS / "_inventories" / f"{name}.inv"
        if local.is_file():
            mapping[name] = (url, str(local))
        elif _ONLINE:
            mapping[name] = (url, None)
    linked = ", ".join(sorted(mapping)) or "none"
    skipped = ", ".join(sorted(set(_INTERSPHINX_URLS) - set(mapping))) or "none"
    print(f"intersphinx: linked {linked}; offline, no inventory for {skipped}")
    return mapping


intersphinx_mapping = _intersphinx_mapping()
intersphinx_timeout = 10

# -- The tutorial gallery -------------------------------------------------------------------------
sphinx_gallery_conf = {
    "examples_dirs": "../tutorials",
    "gallery_dirs": "auto_examples",
    "filename_pattern": r"trl_interop\.py",
    "download_all_examples": False,
    "remove_config_comments": True,
    "matplotlib_animations": False,
    "within_subsection_order": "FileNameSortKey",
    # Each tutorial page ends with its running time ("Total running time of the script"). The
    # separate sg_execution_times page is not written: it loads jQuery, DataTables and Bootstrap
    # from CDNs, and with one tutorial it repeats that one number.
    "write_computation_times": False,
    # Stop the build on a failing tutorial instead of rendering a page with a traceback.
    "abort_on_example_error": True,
}

exclude_patterns = ["_build", "_inventories", "Thumbs.db", ".DS_Store", "sg_execution_times.rst"]

# -- HTML -----------------------------------------------------------------------------------------
# pydata-sphinx-theme: the PyTorch ecosystem's look (pytorch_sphinx_theme2 is built on it) without
# pytorch.org's analytics, consent and CDN scripts. Top-bar entries are the toctree titles of
# index.rst (``Scale <scale>``: a short entry for a long page title).
html_theme = "pydata_sphinx_theme"
# Ours: API pages titled by the short name, as in TorchRL's reference (_templates/autosummary).
templates_path = ["_templates"]
html_title = f"{project} {release}"
html_static_path = ["_static"]
html_css_files = ["custom.css"]
html_theme_options = {
    "logo": {"text": project},
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "show_nav_level": 2,
    # The left bar only on pages that have sub-pages (the API reference, the tutorials): on the
    # others it would be an empty "Section Navigation" column that narrows the code blocks.
    "sidebar_includehidden": False,
    "header_links_before_dropdown": 9,
    # The search field as an icon (Ctrl+K still opens it): nine top-bar entries fit on one line.
    "navbar_persistent": ["search-button"],
    "navbar_end": ["theme-switcher"],
    # No repository URL is published for this project: no GitHub icon or "edit this page".
    "icon_links": [],
    "use_edit_page_button": False,
    "footer_start": ["copyright"],
    "footer_center": [],
    "footer_end": ["sphinx-version", "theme-version"],
}
html_context = {"default_mode": "light"}
# "Show Source" (the page's .rst) is noise for readers; API pages keep their [source] links.
html_show_sourcelink = False
copybutton_prompt_text = r">>> |\.\.\. |\$ "
copybutton_prompt_is_regexp = True
copybutton_exclude = ".linenos, .gp, .go"
suppress_warnings = ["config.cache"]

# The diagram of docs/remote.rst, drawn by a script at every build (never committed).
sys.path.insert(0, str(DOCS))
from diagram_remote import draw  # noqa: E402

(DOCS / "generated").mkdir(exist_ok=True)
draw(str(DOCS / "generated" / "remote_layouts.png"))


def _skip_annotation_only(app, what, name, obj, skip, options):
    """Leaves out members known only from a class's annotations (a tensorclass field such as
    ``MessageHistory.extra_fields``): autosummary cannot import them; the class docstring
    describes them."""
    try:  # Sphinx >= 8.2 (before: sphinx.ext.autodoc.INSTANCEATTR)
        from sphinx.ext.autodoc._sentinels import INSTANCE_ATTR
    except ImportError:  # pragma: no cover
        from sphinx.ext.autodoc import INSTANCEATTR as INSTANCE_ATTR

    return True if obj is INSTANCE_ATTR else None


def setup(app):
    app.connect("autodoc-skip-member", _skip_annotation_only)
