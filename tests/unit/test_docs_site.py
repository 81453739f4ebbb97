"""The documentation site (docs/development.md, "The documentation site"): what its build alone
would find only when someone runs ``make docs``, checked in the suite too, without Sphinx."""

from __future__ import annotations

import re
from pathlib import Path

from django_xjobs import conf

DOCS = Path(__file__).resolve().parents[2] / "docs"

# A row of a table whose first cell is a key in backticks: | `LEASE` | ...
SETTING_ROW = re.compile(r"^\| `([A-Z][A-Z0-9_]*)` \|", re.MULTILINE)
# An autodoc directive of the reference: .. autoclass:: django_xjobs.exceptions.Snooze -> Snooze
AUTODOC = re.compile(r"^\.\. auto\w+:: django_xjobs(?:\.\w+)*\.(\w+)", re.MULTILINE)
TOCTREE = re.compile(r"^```\{toctree\}\n(.*?)^```", re.MULTILINE | re.DOTALL)


def toctree_entries(text: str) -> list[str]:
    """The documents the toctrees of a page list (their options, ``:hidden:``, left out)."""
    return [line.strip() for block in TOCTREE.findall(text) for line in block.splitlines()
            if line.strip() and not line.strip().startswith(":")]


def test_the_settings_reference_lists_every_setting():
    listed = SETTING_ROW.findall((DOCS / "reference" / "settings.md").read_text())
    assert len(listed) == len(set(listed)), "a key has two rows"
    assert set(listed) == conf._KNOWN_KEYS, (
        f"missing: {sorted(conf._KNOWN_KEYS - set(listed))}; "
        f"not a setting: {sorted(set(listed) - conf._KNOWN_KEYS)}")


def test_the_api_reference_documents_every_public_name():
    import django_xjobs

    documented = set()
    for page in (DOCS / "reference").glob("*.md"):
        documented |= set(AUTODOC.findall(page.read_text()))
    missing = sorted(set(django_xjobs.__all__) - {"__version__"} - documented)
    assert missing == [], f"not in docs/reference/: {missing}"


def test_every_page_is_in_the_table_of_contents():
    # Sphinx fails the build on a page no toctree lists; so does this, in `make test`.
    listed = set(toctree_entries((DOCS / "index.md").read_text()))
    pages = {str(p.relative_to(DOCS).with_suffix("")) for p in DOCS.rglob("*.md")
             if not any(part.startswith(("_", ".")) for part in p.relative_to(DOCS).parts)}
    # pypi.md is what PyPI shows (docs/conf.py excludes it); index.md is the root itself.
    assert pages - {"pypi", "index"} == listed, (
        f"not in docs/index.md: {sorted(pages - listed - {'pypi', 'index'})}; "
        f"listed but missing: {sorted(listed - pages)}")


def test_the_toctree_reader_reads_entries_and_skips_options():
    text = "```{toctree}\n:hidden:\n:caption: How-to guides\n\nhowto/a\nguide\n```\n"
    assert toctree_entries(text) == ["howto/a", "guide"]
