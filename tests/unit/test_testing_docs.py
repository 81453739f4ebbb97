"""docs/testing.md prints the example test files of tests/integration/testing_example/, which
the suite runs: the page and the files must not drift apart."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "testing.md"
EXAMPLE = ROOT / "tests" / "integration" / "testing_example"
# A quoted file: the marker line naming it, then a fenced block holding the whole file.
QUOTE = re.compile(r"^<!-- file: (\S+) -->\n```python\n(.*?)^```$", re.M | re.S)


def quoted_files() -> dict[str, str]:
    found: dict[str, str] = {}
    for path, body in QUOTE.findall(DOC.read_text()):
        assert path not in found, f"docs/testing.md quotes {path} twice"
        found[path] = body
    return found


def example_files() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for p in sorted(EXAMPLE.glob("*.py"))
            if p.name != "__init__.py"}


def test_the_page_quotes_every_example_file_and_nothing_else():
    assert len(example_files()) >= 3
    assert sorted(quoted_files()) == sorted(example_files())


def test_each_quoted_file_is_printed_exactly_as_it_is():
    quoted = quoted_files()
    for path, text in example_files().items():
        assert quoted[path] == text, f"docs/testing.md prints an outdated {path}"


def test_every_marker_is_followed_by_its_file():
    markers = re.findall(r"^<!-- file: (\S+) -->$", DOC.read_text(), re.M)
    assert sorted(markers) == sorted(quoted_files()), "a marker without a python block below"
