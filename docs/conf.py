"""Sphinx configuration of the documentation site: `make docs` builds it into docs/_build/html.

The pages are the markdown files of docs/, read by MyST; the API reference (reference/*.md) is
generated from the docstrings by autodoc, which imports the package, so Django is set up first on
the test suite's settings (tests/settings.py). The build touches no database: DATABASE_URL is
pointed at an address nothing is asked of (Django connects on the first query, and importing
the modules runs none), so tests/devdb.py neither probes a server nor starts the embedded one.

`make docs` runs `sphinx-build -W --keep-going -n`: every warning fails the build, and `-n`
(nitpicky) makes every reference that resolves to nothing a warning: a `:class:` role in a
docstring, a link between pages, a `#anchor` of a heading (`myst_heading_anchors`). External
links cannot be followed from a closed network; docs/_ext/xjobs_docs.py checks that they are at
least well formed (docs/development.md, "The documentation site").
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

# No database is reached while building (see the docstring); the name says so in any error.
os.environ["DATABASE_URL"] = "postgres://docs-build@127.0.0.1:9/no-database-while-building-docs"
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import django  # noqa: E402

django.setup()

from django_xjobs.conf import VERSION  # noqa: E402

project = "django-xjobs"
author = "django-xjobs contributors"
copyright = "django-xjobs contributors"
release = VERSION
version = ".".join(VERSION.split(".")[:2])

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "xjobs_docs",  # docs/_ext/xjobs_docs.py: commands' --help, the external-link check
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
# pypi.md is the page PyPI shows (absolute links, the README's twin): not a page of the site.
exclude_patterns = ["_build", "_ext", "pypi.md", "Thumbs.db", ".DS_Store"]

# ---- MyST: the pages stay GitHub-flavoured markdown ----
# Every heading down to ####, the level the pages link to, gets the anchor GitHub gives it
# ("## Idempotency windows" -> #idempotency-windows), so `[..](durable.md#idempotency-windows)`
# resolves here as on GitHub, and a link to an anchor that is gone is a warning (an error, -W).
myst_heading_anchors = 4
myst_enable_extensions = [
    "colon_fence",  # ::: note blocks in the new pages
    "deflist",
]
# Links to files outside the site (a test, a module of the package) are not pages: they stay
# links to the repository on GitHub rather than to a download of the file.
myst_url_schemes = {
    "http": None,
    "https": None,
    "mailto": None,
}

# ---- autodoc ----
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True
autodoc_default_options: dict[str, object] = {}

# -n reports every reference it cannot resolve. References into Python's standard library,
# Django, psycopg and asgiref (in type hints, mostly) would need intersphinx, whose inventories
# are downloaded at build time: the build is offline, so those alone are not checked, nor are
# the type variables of the generic signatures. Every other reference into django_xjobs is.
nitpick_ignore_regex = [
    (r"py:.*", r"(datetime|typing|collections|enum|threading|asyncio|logging|pathlib|types|"
               r"contextlib|decimal|uuid|abc|concurrent|dataclasses|json|re|os)(\..*)?"),
    (r"py:.*", r"(django|psycopg|asgiref|opentelemetry|prometheus_client)(\..*)?"),
    (r"py:class", r"(Any|Callable|Iterable|Iterator|Mapping|Sequence|Self|Literal|LiteralString|"
                  r"NoneType|Awaitable|Coroutine|AsyncIterator|Generator|Concatenate|"
                  r"timedelta|datetime|UUID|Path|TaskResult|TaskResultStatus|TaskError|Task)"),
    # The ParamSpec and TypeVars that carry a job function's signature to its enqueue methods.
    (r"py:(class|obj)", r"(django_xjobs\.registry\.)?(P|R|P\.args|P\.kwargs|D|T)"),
]

# ---- HTML ----
html_theme = "furo"
html_title = f"django-xjobs {release}"
html_static_path: list[str] = []
html_show_sourcelink = False
