"""Comments, docstrings and statement texts point only into the repository (docs/, tests/):
a maintainer who clones it has nothing else to follow."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Documents that live outside the repository, as they were cited: a design card by section
# ("SPEC §2"), a sibling folder, an earlier implementation ("the seed's fix"), a style guide's
# numbered habits, a fault plan's ids ("R3: ...").
OUTSIDE = re.compile(
    r"\bSPEC\b|§|\.\./shared|\bthe seed\b|\bseed's\b|STYLE habit|^\s*#\s*R\d+\b", re.MULTILINE)


def test_no_source_file_points_outside_the_repository():
    found = []
    for path in sorted((ROOT / "django_xjobs").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        for match in OUTSIDE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append(f"{path.relative_to(ROOT)}:{line}: {text.splitlines()[line - 1].strip()}")
    assert found == [], "\n".join(found)


def test_the_pattern_catches_each_way_of_pointing_outside():
    for text in ("Fencing (see SPEC §2)", "the seed's 1.x bug", "(``../shared/seed``)",
                 "    # R3: the live job", "STYLE habit 8"):
        assert OUTSIDE.search(text), text
    assert not OUTSIDE.search("random.seed(42); see docs/guarantees.md")
