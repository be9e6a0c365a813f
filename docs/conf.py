"""Sphinx configuration: API reference, the executed sphinx-gallery tutorial, and the guides."""

import os
import sys

sys.path.insert(0, os.path.abspath(".."))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MPLBACKEND", "Agg")

import torchrl_trl_interop

project = "torchrl-trl-interop"
author = "torchrl-trl-interop developers"
copyright = "2026, torchrl-trl-interop developers"
release = torchrl_trl_interop.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "sphinx_gallery.gen_gallery",
]

autosummary_generate = True
autodoc_typehints = "description"
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "show-inheritance": False}
napoleon_google_docstring = True
napoleon_custom_sections = [("Keyword Args", "params_style")]
nitpicky = False

sphinx_gallery_conf = {
    "examples_dirs": "../tutorials",
    "gallery_dirs": "auto_examples",
    "filename_pattern": r"trl_interop\.py",
    "download_all_examples": False,
    "remove_config_comments": True,
    "matplotlib_animations": False,
    "within_subsection_order": "FileNameSortKey",
}

exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "sg_execution_times.rst"]
html_theme = "alabaster"
html_theme_options = {"description": "Mix TorchRL and Hugging Face TRL piece by piece."}
suppress_warnings = ["config.cache"]

# The diagram of docs/remote.rst, drawn by a script at every build (never committed).
_docs = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _docs)
from diagram_remote import draw  # noqa: E402

os.makedirs(os.path.join(_docs, "generated"), exist_ok=True)
draw(os.path.join(_docs, "generated", "remote_layouts.png"))
