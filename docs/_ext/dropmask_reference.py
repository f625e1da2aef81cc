"""What the site's reference is made of, without Sphinx: the tests read it too.

The namespaces with an API page and the reStructuredText of each page, the inline-code
spellings that link to an entry, and the repository files the site includes with the
pages that include them. ``dropmask_docs`` turns these into Sphinx directives and hooks.
"""

from __future__ import annotations

import importlib
import pathlib
import re
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[2]

# The namespaces users import, each with its page docs/api/<name>.md.
NAMESPACES = (
    "dropmask",
    "dropmask.linen",
    "dropmask.nnx",
    "dropmask.training",
    "dropmask.uncertainty",
    "dropmask.audit",
    "dropmask.why",
    "dropmask.testing",
)

# The short names the guides import the namespaces as.
ALIASES = {"dm": "dropmask", "dl": "dropmask.linen", "dnnx": "dropmask.nnx"}

# Files outside docs/ that the site includes: repository path -> page (without .md).
PAGES = {
    "examples/digits/README.md": "examples/digits",
    "examples/seq2seq/README.md": "examples/seq2seq",
    "examples/sst2/README.md": "examples/sst2",
    "examples/translate/README.md": "examples/translate",
    "examples/lm/README.md": "examples/lm",
    "benchmarks/RESULTS.md": "benchmarks",
    "CHANGELOG.md": "changelog",
    "src/dropmask/_random/README.md": "internals/random",
    "src/dropmask/_attention/README.md": "internals/attention",
    "src/dropmask/_structured/README.md": "internals/structured",
    "src/dropmask/_workflow/README.md": "internals/workflow",
    "src/dropmask/linen/README.md": "internals/linen",
    "src/dropmask/nnx/README.md": "internals/nnx",
    "src/dropmask/uncertainty/README.md": "internals/uncertainty",
    "src/dropmask/training/README.md": "internals/training",
    "src/dropmask/audit/README.md": "internals/audit",
    "src/dropmask/why/README.md": "internals/why",
    "src/dropmask/examples/README.md": "internals/examples",
}

_LINK = re.compile(r"\]\((?P<path>[^)#\s]+\.md)(?P<anchor>#[^)\s]*)?\)")


def public_names() -> dict[str, list[str]]:
    """``{namespace: its __all__}`` for every namespace in :data:`NAMESPACES`."""
    return {name: list(importlib.import_module(name).__all__) for name in NAMESPACES}


def api_source(namespace: str) -> str:
    """The reStructuredText a ``public-api`` directive inserts for ``namespace``.

    The module's docstring, a summary table of its ``__all__``, then one entry per name
    in that order, each with the autodoc directive for its kind.
    """
    module = importlib.import_module(namespace)
    names = list(module.__all__)
    parts = [
        f".. automodule:: {namespace}\n   :no-members:\n",
        f".. currentmodule:: {namespace}\n",
        ".. autosummary::\n   :nosignatures:\n\n" + "".join(f"   {n}\n" for n in names),
    ]
    for name in names:
        kind, options = _entry_kind(getattr(module, name))
        parts.append(f".. auto{kind}:: {name}\n" + "".join(f"   :{o}\n" for o in options))
    return "\n".join(parts)


def _entry_kind(obj: Any) -> tuple[str, tuple[str, ...]]:
    if isinstance(obj, type) and issubclass(obj, BaseException):
        return "exception", ("show-inheritance:",)
    if isinstance(obj, type):
        # Fields are documented once, in the class's ``Attributes:`` section.
        fields = [*getattr(obj, "_fields", ()), *getattr(obj, "__dataclass_fields__", {})]
        fields = [f for f in fields if f in vars(obj)]
        return "class", ("members:", *([f"exclude-members: {', '.join(fields)}"] if fields else []))
    if callable(obj):
        return "function", ()
    return "data", ()


def link_targets() -> dict[str, tuple[str, str]]:
    """Inline-code spellings that name a public object: ``text -> (role, target)``.

    A full name always links; ``dm.x`` / ``dl.X`` / ``dnnx.X`` as the guides import
    them; a bare name when only one namespace exports it and it cannot be read as a
    plain word (a top-level function, a class, a name with an underscore).
    """
    targets: dict[str, tuple[str, str]] = {ns: ("mod", ns) for ns in NAMESPACES}
    owners: dict[str, list[str]] = {}
    for namespace, names in public_names().items():
        for name in names:
            targets[f"{namespace}.{name}"] = ("obj", f"{namespace}.{name}")
            owners.setdefault(name, []).append(namespace)
    for alias, namespace in ALIASES.items():
        for name in importlib.import_module(namespace).__all__:
            targets[f"{alias}.{name}"] = ("obj", f"{namespace}.{name}")
    for name, where in owners.items():
        camel = name[:1].isupper() and not name.isupper()
        if len(where) == 1 and (where == ["dropmask"] or "_" in name or camel):
            targets[name] = ("obj", f"{where[0]}.{name}")
    return targets


def page_of(path: str) -> str | None:
    """The site's page (without ``.md``) that shows the repository file ``path``, if any.

    A page of ``docs/`` is itself; an included file is the page of :data:`PAGES`.
    """
    if path in PAGES:
        return PAGES[path]
    if path.startswith("docs/") and path.endswith(".md") and (ROOT / path).is_file():
        return path.removeprefix("docs/").removesuffix(".md")
    return None


def rewrite_repo_links(text: str, docname: str) -> str:
    """Links written as GitHub resolves them, from ``docname``, to the site's pages.

    ``docname`` is where the text lives, relative to ``docs/`` without ``.md`` (for an
    included file, its own place: ``../CHANGELOG``). A link to an included file goes to
    the page that includes it, a link to a page of ``docs/`` to that page; both are
    written from the site's root, so they hold wherever the text is included. Any other
    link is left as written (a broken one fails the strict build).
    """
    here = ROOT / "docs" / pathlib.Path(docname).parent

    def repl(match: re.Match[str]) -> str:
        path = (here / match["path"]).resolve()
        try:
            key = path.relative_to(ROOT).as_posix()
        except ValueError:
            return match[0]
        page = page_of(key)
        if page is None:
            return match[0]
        return f"](/{page}.md{match['anchor'] or ''})"

    return _LINK.sub(repl, text)
