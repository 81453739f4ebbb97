"""Comments, docstrings and statement texts of the package and the suite point only into the
repository (docs/, tests/): a maintainer who clones it has nothing else to follow. What they
point at exists: a docs page, the heading they name in it, and each test that docs/ says pins an
invariant."""

from __future__ import annotations

import re
from pathlib import Path

from tests.unit.test_package_metadata import github_anchors

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "django_xjobs"
DOCS = ROOT / "docs"

# Documents that live outside the repository, as they were cited: a design card by section
# ("SPEC §2") or by name, a sibling folder, an earlier implementation ("the seed's fix"), a
# style guide (by name or by its numbered habits), a fault plan's ids ("R3: ..."), the research
# notes and the survey of other job systems, the developers' notes.
OUTSIDE = re.compile(
    r"\bSPEC\b|§|\.\./shared|\bthe seed\b|\bseed's\b|STYLE habit|^\s*#\s*R\d+\b"
    r"|STYLE\.md|DEVELOPERS\.md|reliability\.md|research/|(?i:\blandscape\b)|(?i:\bdesign card\b)",
    re.MULTILINE,
)

# A page of docs/ as the package cites it, with what may follow: an anchor
# ("docs/design.md#fencing") or a heading named in quotes ('docs/guide.md, "Settings"' or
# 'docs/console.md ("The health panel")').
DOC_REFERENCE = re.compile(r"docs/([\w./-]+?\.md)(?:#([\w-]+)|,?\s*\(?\"([^\"\n]+)\")?")

# A test named by its file and function, as docs/ cites the tests that pin an invariant.
TEST_REFERENCE = re.compile(r"\b(tests/[\w/]+\.py)::(\w+)")


def package_texts() -> list[tuple[Path, str]]:
    """The package's source and its templates: every text a maintainer reads as a comment."""
    return [(path, path.read_text(encoding="utf-8")) for path in sorted(PACKAGE.rglob("*"))
            if path.suffix in {".py", ".html", ".txt", ".css", ".js"}]


def where(path: Path, text: str, offset: int) -> str:
    line = text.count("\n", 0, offset) + 1
    return f"{path.relative_to(ROOT)}:{line}: {text.splitlines()[line - 1].strip()}"


def broken_doc_references(path: Path, text: str) -> list[str]:
    found = []
    for match in DOC_REFERENCE.finditer(text):
        page, anchor, heading = match.groups()
        target = DOCS / page
        if not target.is_file():
            found.append(f"{where(path, text, match.start())}  (no docs/{page})")
            continue
        wanted = anchor or (heading and next(iter(github_anchors(f"# {heading}"))))
        if wanted and wanted not in github_anchors(target.read_text(encoding="utf-8")):
            found.append(f"{where(path, text, match.start())}  (no such heading in docs/{page})")
    return found


def suite_texts() -> list[tuple[Path, str]]:
    """The suite's own files, but this one (whose examples name outside documents on purpose)."""
    this = Path(__file__).resolve()
    return [(path, path.read_text(encoding="utf-8"))
            for path in sorted((ROOT / "tests").rglob("*.py")) if path.resolve() != this]


def test_no_source_file_points_outside_the_repository():
    found = [where(path, text, match.start())
             for path, text in package_texts() + suite_texts()
             for match in OUTSIDE.finditer(text)]
    assert found == [], "\n".join(found)


def test_the_pattern_catches_each_way_of_pointing_outside():
    for text in ("Fencing (see SPEC §2)", "the seed's 1.x bug", "(``../shared/seed``)",
                 "    # R3: the live job", "STYLE habit 8", "see STYLE.md", "SPEC.md, section 8",
                 "DEVELOPERS.md", "reliability.md F19", "research/pgqueuer.md",
                 "the landscape survey", "The design card names it"):
        assert OUTSIDE.search(text), text
    for text in ("random.seed(42); see docs/guarantees.md", "a spec of the input",
                 "docs/design.md#fencing", "a cardinality of two"):
        assert not OUTSIDE.search(text), text


def test_every_docs_page_and_heading_the_package_names_exists():
    found = [line for path, text in package_texts()
             for line in broken_doc_references(path, text)]
    assert found == [], "\n".join(found)


def test_the_reference_pattern_reads_each_way_of_naming_a_page():
    def groups(text: str) -> tuple[str | None, ...]:
        match = DOC_REFERENCE.search(text)
        assert match, text
        return match.groups()

    assert groups("(docs/guarantees.md)") == ("guarantees.md", None, None)
    assert groups("see docs/design.md#the-lease-token.") == ("design.md", "the-lease-token", None)
    assert groups('(docs/guide.md, "Settings")') == ("guide.md", None, "Settings")
    assert groups('docs/console.md ("The health panel") says') == (
        "console.md", None, "The health panel")
    assert broken_doc_references(ROOT / "x.py", "docs/nowhere.md") != []
    assert broken_doc_references(ROOT / "x.py", "docs/design.md#no-such-heading") != []
    assert broken_doc_references(ROOT / "x.py", 'docs/guide.md, "No such heading"') != []
    assert broken_doc_references(ROOT / "x.py", "docs/design.md#fencing") == []


def broken_test_references(path: Path, text: str) -> list[str]:
    found = []
    for match in TEST_REFERENCE.finditer(text):
        file, name = match.groups()
        target = ROOT / file
        if not target.is_file() or not re.search(rf"^\s*(?:async\s+)?def {name}\(",
                                                 target.read_text(encoding="utf-8"), re.MULTILINE):
            found.append(f"{where(path, text, match.start())}  (no {file}::{name})")
    return found


def test_every_test_the_docs_and_the_package_name_exists():
    pages = [(page, page.read_text(encoding="utf-8")) for page in sorted(DOCS.glob("*.md"))]
    found = [line for path, text in pages + package_texts()
             for line in broken_test_references(path, text)]
    assert found == [], "\n".join(found)


def test_a_test_reference_must_name_a_test_function_of_that_file():
    this = "tests/unit/test_references.py::test_every_test_the_docs_and_the_package_name"
    assert broken_test_references(ROOT / "x.md", f"`{this}_exists`") == []
    assert broken_test_references(ROOT / "x.md", f"`{this}`") != []  # a prefix is not a name
    assert broken_test_references(ROOT / "x.md", "`tests/unit/test_nowhere.py::test_x`") != []


def test_every_anchor_a_docs_page_links_is_a_heading():
    found = []
    for page in [*sorted(DOCS.glob("*.md")), ROOT / "README.md"]:
        text = page.read_text(encoding="utf-8")
        for match in re.finditer(r"\]\(([^)#\s]*)#([^)\s]+)\)", text):
            target = (page.parent / match.group(1)) if match.group(1) else page
            if target.suffix == ".md" and (not target.is_file() or match.group(2)
                                           not in github_anchors(target.read_text())):
                found.append(where(page, text, match.start()))
    assert found == [], "\n".join(found)


def test_the_design_names_every_statement_under_its_module():
    """docs/design.md, "Statement families": each section opens with "Module `<family>.py`", and
    names every statement of that module of engines/postgres/statements/ (and no other's)."""
    import importlib
    import pkgutil

    from django_xjobs.engines.base import Statement
    from django_xjobs.engines.postgres import statements

    text = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    families = text[text.index("## Statement families"):text.index("## Invariants")]
    sections = {}
    for section in re.split(r"^### ", families, flags=re.MULTILINE)[1:]:
        module = re.search(r"Module `(\w+)\.py`", section)
        assert module, section[:60]
        sections[module.group(1)] = set(re.findall(r"`([A-Z][A-Z_]+)`", section))
    misplaced = []
    for info in pkgutil.iter_modules(statements.__path__):
        module = importlib.import_module(f"{statements.__name__}.{info.name}")
        for name, value in vars(module).items():
            if isinstance(value, Statement) and name not in sections.get(info.name, ()):
                misplaced.append(f"{name} ({info.name}.py)")
    assert misplaced == []
