"""Sphinx configuration of dropmask's documentation site (`make docs`).

The stack is Flax's and Optax's: Sphinx with MyST-parser (the guides stay the Markdown
GitHub shows and `tests/test_docs.py` runs), sphinx-book-theme, autodoc with napoleon
for the Google-style docstrings, and sphinx-argparse for the command's reference from
its own parsers. JAX users know that layout, and the guides need no second format.

The build is strict (`-W --keep-going -n`): a broken cross-reference, a public name
without an entry, or a docstring that does not render fails it. No inventory is
fetched (intersphinx needs the network): names of JAX, Flax, NumPy and the standard
library stay plain text, listed in `nitpick_ignore_regex`; every `dropmask` name must
resolve.
"""

from __future__ import annotations

import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))

project = "dropmask"
author = "dropmask authors"
copyright = "dropmask authors"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinxarg.ext",
    "dropmask_docs",
]

root_doc = "index"
exclude_patterns = ["_build", "**/.ipynb_checkpoints"]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}

myst_enable_extensions = ["colon_fence", "deflist", "dollarmath"]
myst_heading_anchors = 4  # guides link to sections as GitHub does: guide.md#15-a-fresh-key...

autodoc_typehints = "signature"
autodoc_member_order = "bysource"
autodoc_preserve_defaults = True
autosummary_generate = False
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
# A field's type is in the class signature; here it would be spelled as the runtime
# resolves it (jax.jaxlib._jax.Array).
napoleon_attr_annotations = False
add_module_names = False
python_use_unqualified_type_names = True

nitpicky = True
# Private types that public signatures name: shown as text, without an entry.
nitpick_ignore = [
    ("py:class", "dropmask.training._keys.HasKeyAndStep"),
]
# Names outside dropmask have no inventory offline: they render as plain text.
nitpick_ignore_regex = [
    ("py:.*", r"(jax|jaxlib|flax|optax|numpy|np|jnp|orbax|ml_collections|chex)(\..*)?"),
    ("py:.*", r"(collections|typing|typing_extensions|types|enum|dataclasses|pathlib)\..*"),
    ("py:.*", r"(argparse|abc|os|io|json|functools|contextlib|builtins)\..*"),
    ("py:.*", r"(int|float|bool|str|bytes|complex|tuple|list|dict|set|frozenset|object)"),
    ("py:.*", r"(None|type|callable|Callable|Any|Sequence|Mapping|Iterable|Iterator)"),
    ("py:.*", r"(ValueError|TypeError|RuntimeError|KeyError|Exception|IndexError)"),
    ("py:.*", r"(ArrayLike|Array|PRNGKeyArray|DTypeLike|PyTree|Shape|ArrayTree)"),
    ("py:.*", r"(nn|nnx)\..*"),  # flax.linen and flax.nnx as the annotations import them
]

html_theme = "sphinx_book_theme"
html_title = "dropmask"
html_static_path = ["_static"]
html_favicon = "_static/favicon.svg"
# pydata-sphinx-theme logs a console error on a first visit without a stored mode.
html_context = {"default_mode": "auto"}
html_theme_options = {
    "show_toc_level": 2,
    "navigation_with_keys": False,
    "home_page_in_toc": True,
    "use_download_button": False,  # the sources are not copied (html_copy_source)
    "navbar_persistent": [],  # one search box, the sidebar's
}
toc_object_entries_show_parents = "hide"  # "rate", not "DropBlock.rate", in a page's contents
html_last_updated_fmt = None
html_copy_source = False
smartquotes_action = "qe"  # no dashes: a flag such as --config must stay two hyphens
# Signatures keep the annotations' names (`jax.typing.ArrayLike`), not their expansion
# into a ten-member union.
autodoc_type_aliases = {
    "jax.typing.ArrayLike": "jax.typing.ArrayLike",
    "ArrayLike": "jax.typing.ArrayLike",
}
