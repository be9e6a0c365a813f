"""Sphinx configuration: API reference, the executed sphinx-gallery tutorial, and the guides.

The site uses the PyTorch ecosystem's theme (``pytorch_sphinx_theme2``, as TorchRL and tensordict
do), copy buttons on code blocks, and links into the docs of torch, tensordict, torchrl,
transformers, trl and datasets through intersphinx (see ``_intersphinx_mapping`` below for how
that behaves offline). ``make docs`` builds it with warnings as errors.
"""

import os
import re
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MPLBACKEND", "Agg")

import markupsafe
import pytorch_sphinx_theme2
from sphinx.util import logging as sphinx_logging

import torchrl_trl_interop

logger = sphinx_logging.getLogger(__name__)

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
    "pytorch_sphinx_theme2",
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

# -- HTML: the PyTorch ecosystem's theme ----------------------------------------------------------
html_theme = "pytorch_sphinx_theme2"
html_theme_path = [pytorch_sphinx_theme2.get_html_theme_path()]
# Ours first (API pages titled by the short name, as in TorchRL's reference; layout.html, see
# _without_trackers), then the theme's page templates (navbar, search field, ...), which it keeps
# in a sub-folder, and the theme's folder itself, so that our layout.html can extend
# "templates/layout.html".
_THEME_DIR = Path(pytorch_sphinx_theme2.__file__).parent
templates_path = ["_templates", str(_THEME_DIR / "templates"), str(_THEME_DIR)]
html_title = f"{project} {release}"
html_static_path = ["_static"]
html_css_files = ["custom.css"]
html_theme_options = {
    "logo": {"text": project},
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "show_nav_level": 2,
    "navbar_center": "navbar-nav",
    "header_links_before_dropdown": 8,
    # Not a pytorch.org-hosted project: no Linux Foundation header/footer, no pytorch.org link,
    # no page-rating widget or analytics, no llms.txt.
    "show_lf_header": False,
    "show_lf_footer": False,
    "show_pytorch_org_link": False,
    "article_header_end": [],
    "article_footer_items": [],
    "use_edit_page_button": False,
    "llm_disabled": True,
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


def _short_navbar_titles(app, pagename, templatename, context, doctree):
    """Top-bar entries use the page title up to its first ``:`` or ``,``.

    ("Scale: workers, ranks, ..." -> "Scale"); the page itself keeps its full title. Runs after
    the theme has filled ``hierarchical_header_nav``.
    """
    for item in context.get("hierarchical_header_nav") or []:
        if not item.get("external"):
            item["title"] = re.split(r"[:,]", item["title"], maxsplit=1)[0].strip()


# The theme is made for pytorch.org's own sites: its page head loads Google Tag Manager, a Facebook
# pixel, a consent manager, Google site search, jQuery and list.js from CDNs, Google Fonts, and a
# PyTorch preview image; its footer says "Copyright © Meta Platforms". Not ours to send readers
# to: _templates/layout.html filters the head through `without_trackers` and uses the base
# theme's footer, and the build fails (a warning, under -W) if a page still names one of them.
_THIRD_PARTY = (
    "googletagmanager.com",
    "connect.facebook.net",
    "facebook.com/tr",
    "osano.com",
    "cse.google.com",
    "code.jquery.com",
    "cdnjs.cloudflare.com",
    "fonts.googleapis.com",
    "fonts.gstatic.com",
    "pytorch_seo.png",
    "Meta Platforms",
)
_THIRD_PARTY_RE = "|".join(re.escape(host) for host in _THIRD_PARTY)


def _without_trackers(head: str, local_jquery: str) -> str:
    """The theme's page head without the third-party pieces above (jQuery from the theme's copy)."""
    head = re.sub(r'src="https://code\.jquery\.com/[^"]*"', f'src="{local_jquery}"', str(head))
    for tag in ("script", "noscript"):
        inline = (
            rf"<{tag}\b[^>]*>(?:(?!</{tag}>).)*?(?:{_THIRD_PARTY_RE})(?:(?!</{tag}>).)*</{tag}>"
        )
        loaded = rf"<{tag}\b[^>]*(?:{_THIRD_PARTY_RE})[^>]*>\s*</{tag}>"
        head = re.sub(f"{loaded}|{inline}", "", head, flags=re.DOTALL)
    head = re.sub(rf"<(?:link|meta)\b[^>]*(?:{_THIRD_PARTY_RE})[^>]*>", "", head)
    return markupsafe.Markup(head)


def _add_template_filters(app):
    if hasattr(app.builder, "templates"):
        app.builder.templates.environment.filters["without_trackers"] = _without_trackers


def _check_no_third_party(app, exception):
    if exception is not None or app.builder.format != "html":
        return
    for page in sorted(Path(app.outdir).rglob("*.html")):
        found = set(re.findall(_THIRD_PARTY_RE, page.read_text(encoding="utf-8")))
        if found:
            logger.warning(
                "%s still names %s: update _without_trackers in docs/conf.py for this version "
                "of pytorch_sphinx_theme2",
                page.relative_to(app.outdir),
                ", ".join(sorted(found)),
            )


def setup(app):
    app.connect("builder-inited", _add_template_filters)
    app.connect("html-page-context", _short_navbar_titles, priority=900)
    app.connect("build-finished", _check_no_third_party)
