"""The documentation site's own Sphinx extension (docs/conf.py loads it).

* ``command-help``: a management command's ``--help``, taken from the command's own parser when
  the site is built, so the reference cannot drift from the code. ``:subcommands:`` adds the
  ``--help`` of each action (``manage.py xjobs show --help``, ...).
* Links to files of the repository outside docs/ (``[CHANGELOG.md](../CHANGELOG.md#...)``,
  ``[bench/RESULTS.md](../bench/RESULTS.md)``), which work on GitHub as they are, are rewritten
  for the site as it reads each page: the changelog to its page here (docs/changelog.md includes
  it), anything else to the file in the repository on the web (``REPOSITORY``).
* A check that every external link on the site is well formed (a scheme of http, https or
  mailto, a host, no spaces): the build cannot follow links on a closed network, but it can
  refuse one that no browser could (docs/development.md, "The documentation site"). A bad link
  is a warning, which ``-W`` makes an error.
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.application import Sphinx
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

from django_xjobs.conf import DOCS_URL

logger = logging.getLogger(__name__)

# Where a file of the repository is read on the web: the folder above the published docs/
# (django_xjobs.conf.DOCS_URL, which tests/unit/test_package_metadata.py keeps equal to
# pyproject.toml's "Documentation" address).
REPOSITORY = DOCS_URL.removesuffix("docs/")
# A markdown link whose target climbs out of the page's folder: [text](../x/y.md#anchor)
LINK_UP = re.compile(r"\]\((?P<path>(?:\.\./)+[^)\s#]+)(?P<anchor>#[^)\s]*)?\)")

# argparse wraps help text at the terminal's width: a fixed one, so each build prints the same.
HELP_WIDTH = "88"


def command_help(name: str, *, subcommands: bool) -> str:
    """``manage.py NAME --help`` as the command prints it (and each action's, if asked)."""
    from django.core.management import load_command_class

    os.environ["COLUMNS"] = HELP_WIDTH
    command = load_command_class("django_xjobs", name)
    parser = command.create_parser("manage.py", name)
    text = parser.format_help()
    if subcommands:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    text += "\n" + sub.format_help()
    return text


class CommandHelp(SphinxDirective):
    required_arguments = 1
    option_spec = {"subcommands": directives.flag}

    def run(self) -> list[nodes.Node]:
        name = self.arguments[0]
        try:
            text = command_help(name, subcommands="subcommands" in self.options)
        except Exception as exc:  # a command that cannot be loaded: say which, fail the build
            raise self.error(f"command-help: cannot read the help of {name!r}: {exc}") from exc
        block = nodes.literal_block(text, text, language="text")
        return [block]


def outside_links(app: Sphinx, docname: str, source: list[str]) -> None:
    """Rewrite the links of page ``docname`` to files outside docs/ (the module docstring)."""
    docs = Path(app.srcdir).resolve()
    root = docs.parent
    page_dir = (docs / docname).parent

    def rewrite(match: re.Match[str]) -> str:
        target = (page_dir / match["path"]).resolve()
        anchor = match["anchor"] or ""
        if target.is_relative_to(docs) or not target.is_relative_to(root):
            return match[0]  # a page of the site, or not of the repository: MyST judges it
        if target == root / "CHANGELOG.md":
            changelog = os.path.relpath(docs / "changelog.md", page_dir)
            return f"]({changelog}{anchor})"
        return f"]({REPOSITORY}{target.relative_to(root).as_posix()}{anchor})"

    source[0] = LINK_UP.sub(rewrite, source[0])


def malformed(uri: str) -> str | None:
    """Why ``uri``, an external link, is not well formed; None when it is."""
    if any(c.isspace() for c in uri):
        return "contains white space"
    parts = urlsplit(uri)
    if parts.scheme == "mailto":
        return None if "@" in parts.path else "mailto: without an address"
    if parts.scheme not in ("http", "https"):
        return f"scheme {parts.scheme!r} is not http or https"
    host = parts.hostname or ""
    if not host or ("." not in host and host != "localhost"):
        return f"host {host!r} is not a host name"
    return None


def check_external_links(app: Sphinx, doctree: nodes.document, docname: str) -> None:
    for ref in doctree.findall(nodes.reference):
        uri = ref.get("refuri", "")
        # A link between pages has no scheme; anything with one is external (http:/x too).
        if not uri or not (urlsplit(uri).scheme or "://" in uri):
            continue
        reason = malformed(uri)
        if reason:
            logger.warning("malformed external link %r: %s", uri, reason,
                           location=(docname, ref.line), type="xjobs", subtype="link")


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("command-help", CommandHelp)
    app.connect("source-read", outside_links)
    app.connect("doctree-resolved", check_external_links)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
