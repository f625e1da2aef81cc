"""What the site adds to Sphinx: API pages from ``__all__``, links from names, repo paths.

* ``{public-api} dropmask.linen`` expands to a summary table of the module's
  ``__all__`` and an ``automodule`` entry for each name, so a name added to ``__all__``
  gets its entry without editing a page; a public name without a docstring warns (and
  the strict build fails).
* Inline code in a page that names a public object (```drop_block```,
  ```dropmask.linen.LayerDrop```, ```dl.Dropout```) links to its entry, so the
  Markdown stays plain on GitHub and every mention on the site is a link.
* The guides link to files outside ``docs/`` by their repository paths, as GitHub
  shows them; ``dropmask_reference.PAGES`` maps each such file to the site page that includes it.
* A docstring names a guide by its repository path (```docs/attention.md```) so that
  ``help()`` reads well; on the site that path links to the page (a path that is no
  page warns, and the strict build fails).
* A signature's type variables (``dropmask._scan.Carry``) show as text; any other name
  of dropmask that does not resolve fails the strict build.
"""

from __future__ import annotations

import importlib
import os
import pathlib
import re
import sys
from typing import Any, TypeVar

from docutils import nodes
from docutils.statemachine import StringList
from dropmask_reference import (
    ROOT,
    api_source,
    link_targets,
    page_of,
    public_names,
    rewrite_repo_links,
)
from sphinx.addnodes import pending_xref
from sphinx.application import Sphinx
from sphinx.errors import PycodeError
from sphinx.pycode import ModuleAnalyzer
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)


class PublicApi(SphinxDirective):
    """``{public-api} NAMESPACE``: the summary and entries of every name in ``__all__``."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        # The pages are Markdown, whose nested parse reads Markdown: wrap the reST.
        text = "```{eval-rst}\n" + api_source(self.arguments[0]) + "```\n"
        container = nodes.container()
        lines = StringList(text.splitlines(), source=self.get_source_info()[0])
        self.state.nested_parse(lines, self.content_offset, container)
        return container.children


def _link_inline_code(app: Sphinx, doctree: nodes.document) -> None:
    targets = app.env.dropmask_link_targets  # type: ignore[attr-defined]
    if app.env.docname.startswith("api/"):
        # A docstring's ``rate`` is an argument, not a name to look up: only full names.
        targets = {k: v for k, v in targets.items() if k.startswith("dropmask")}
    for literal in list(doctree.findall(nodes.literal)):
        if isinstance(literal.parent, (nodes.reference, pending_xref, nodes.title)):
            continue  # already a link, or a heading (a link in the page's contents)
        text = literal.astext()
        found = targets.get(text.removesuffix("()"))
        if found is None:
            continue
        role, target = found
        xref = pending_xref(
            "",
            refdomain="py",
            reftype=role,
            reftarget=target,
            refexplicit=True,
            refwarn=True,
            refdoc=app.env.docname,
        )
        literal.replace_self(xref)
        xref += literal


_DOCS_PATH = re.compile(r"docs/[\w/]+\.md")


def _link_docs_paths(app: Sphinx, doctree: nodes.document, docname: str) -> None:
    """A literal ``docs/<page>.md`` becomes a link to that page of the site."""
    for literal in list(doctree.findall(nodes.literal)):
        text = literal.astext()
        if isinstance(literal.parent, (nodes.reference, nodes.title)) or not _DOCS_PATH.fullmatch(
            text
        ):
            continue
        page = page_of(text)
        if page is None or page not in app.env.all_docs:
            logger.warning("%s names %s, which is no page of the site", docname, text)
            continue
        uri = app.builder.get_relative_uri(docname, page)
        literal.replace_self(nodes.reference("", "", literal.deepcopy(), refuri=uri))


def _type_variable_as_text(app: Sphinx, env: Any, node: pending_xref, contnode: nodes.Node):
    """A signature's type variable (``dropmask._scan.Carry``) is text, as Python shows it."""
    target = node.get("reftarget", "")
    if node.get("refdomain") != "py" or not target.startswith("dropmask."):
        return None
    module_name, _, attr = target.rpartition(".")
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError):
        return None
    return contnode if isinstance(obj, TypeVar) else None


def _on_source_read(app: Sphinx, docname: str, source: list[str]) -> None:
    source[0] = rewrite_repo_links(source[0], docname)


def _on_include_read(
    app: Sphinx, relative_path: pathlib.Path, parent_docname: str, content: list[str]
) -> None:
    # An included file's links are relative to the file itself.
    included = (ROOT / "docs" / pathlib.Path(parent_docname).parent / relative_path).resolve()
    content[0] = rewrite_repo_links(content[0], os.path.relpath(included, ROOT / "docs"))


def _data_docstring(namespace: str, name: str) -> list[str] | None:
    """The docstring written under a constant where the package defines it.

    First a module attribute of the same name and value; then, for a constant exported
    under another name (``DROPOUT_MASK_NAME``), the same value in a private module.
    """
    obj = getattr(importlib.import_module(namespace), name)
    package = namespace.split(".")[0] + "."
    modules = sorted(m for m in sys.modules if m.startswith(package))
    private = [m for m in modules if "._" in m]
    for module_name, same_name in [(m, True) for m in modules] + [(m, False) for m in private]:
        try:
            docs = ModuleAnalyzer.for_module(module_name).find_attr_docs()
        except PycodeError:
            continue
        module = sys.modules[module_name]
        for (scope, attr), doc in docs.items():
            if scope or (same_name and attr != name):
                continue
            if getattr(module, attr, None) is obj:
                return list(doc)
    return None


def _process_docstring(app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]):
    if name not in app.env.dropmask_flat:  # type: ignore[attr-defined]
        return
    if what == "data":
        # autodoc falls back to the docstring of the value's type (str, dict): never
        # what a constant means. Take the one written where the constant is defined.
        namespace, _, attr = name.rpartition(".")
        lines[:] = _data_docstring(namespace, attr) or []
    if not any(line.strip() for line in lines):
        logger.warning("public name %s has no docstring", name, type="dropmask", subtype="undoc")


_FUNCTION_REPR = re.compile(r"<function ([\w.]+)(?: at 0x[0-9a-f]+)?>")
_ALIAS_REPR = re.compile(r"TypeAliasForwardRef\('([\w.]+)'\)")
_OBJECT_REPR = re.compile(r"<[\w.]+ object(?: at 0x[0-9a-f]+)?>")


def _readable_signature(app, what, name, obj, options, signature, return_annotation):
    """Defaults shown as Python reprs (``<function f>``, Flax's ``<..._Sentinel object>``)
    cannot be parsed back, and an unparsable signature is split at every comma (breaking
    ``tuple[float, ...]``): a function default is shown by name, an object by ``...``,
    and a type alias (``autodoc_type_aliases``) by its name."""

    def readable(text: str | None) -> str | None:
        if not text:
            return text
        text = _ALIAS_REPR.sub(r"\1", text)  # Sphinx's own, for an alias in a union
        return _OBJECT_REPR.sub("...", _FUNCTION_REPR.sub(r"\1", text))

    return readable(signature), readable(return_annotation)


def _on_builder_inited(app: Sphinx) -> None:
    public = public_names()
    app.env.dropmask_flat = {f"{ns}.{n}" for ns, names in public.items() for n in names}  # type: ignore[attr-defined]
    app.env.dropmask_link_targets = link_targets()  # type: ignore[attr-defined]


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("public-api", PublicApi)
    app.connect("builder-inited", _on_builder_inited)
    app.connect("source-read", _on_source_read)
    app.connect("include-read", _on_include_read)
    app.connect("doctree-read", _link_inline_code)
    app.connect("doctree-resolved", _link_docs_paths)
    app.connect("missing-reference", _type_variable_as_text)
    app.connect("autodoc-process-docstring", _process_docstring, priority=400)
    app.connect("autodoc-process-signature", _readable_signature)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
