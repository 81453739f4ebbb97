"""What a pip user gets besides the code: metadata, license, long description, changelog, and
documentation links that work outside a clone of the repository. The built wheel itself is
checked in tests/acceptance/test_package.py."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from django_xjobs import conf

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
HOME = conf.DOCS_URL.split("/blob/")[0]  # the repository's public address


def github_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings of a page ("## Cron syntax" -> "cron-syntax")."""
    anchors = set()
    in_code = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and (m := re.match(r"#{1,6} (.+)", line)):
            text = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower())
            anchors.add(text.replace(" ", "-"))
    return anchors


def published_page_exists(url: str) -> bool:
    """Whether a DOCS_URL (or repository) link names a file of this checkout, and a heading of
    it when it has an anchor."""
    assert url.startswith(HOME + "/blob/main/"), url
    path, _, anchor = url.removeprefix(HOME + "/blob/main/").partition("#")
    target = ROOT / path
    if not target.exists():
        return False
    return not anchor or anchor in github_anchors(target.read_text())


def links(markdown: str) -> list[str]:
    return re.findall(r"\]\(([^)\s]+)\)", markdown)


def test_the_documentation_url_is_defined_once():
    # The hints of the system checks link conf.DOCS_URL; PyPI shows [project.urls]. The
    # repository's home is an assumption the maintainers change in these two places only.
    assert PROJECT["urls"]["Documentation"] == conf.DOCS_URL
    assert conf.DOCS_URL.endswith("/docs/")
    for name, url in PROJECT["urls"].items():
        assert url.startswith(HOME), (name, url)
    assert published_page_exists(PROJECT["urls"]["Changelog"])


def test_the_long_description_is_written_for_a_pip_user():
    assert PROJECT["readme"] == "docs/pypi.md"
    page = (ROOT / PROJECT["readme"]).read_text()
    for essential in (
        "pip install django-xjobs",
        'INSTALLED_APPS += ["rangefilter", "django_xjobs"]',
        "python manage.py migrate",
        "python manage.py xjobs_worker",
        conf.DOCS_URL + "guide.md",
        conf.DOCS_URL + "deployment.md",
    ):
        assert essential in page, essential
    # PyPI renders the page away from the repository: a relative link would lead nowhere.
    found = links(page)
    assert found
    for url in found:
        assert url.startswith(HOME + "/blob/main/"), url
        assert published_page_exists(url), url


def test_the_long_description_says_an_idempotency_key_holds_while_the_job_is_live():
    for page in ("docs/pypi.md", "README.md"):
        text = (ROOT / page).read_text()
        assert "idempotency_key=" in text
        assert re.search(r"\*\*live\*\*", text), page
        assert "finished" in text, page


def test_the_readme_keeps_the_two_commands_of_a_clone_first():
    readme = (ROOT / "README.md").read_text()
    first_screen = readme[:readme.index("\n## ")]
    assert "make demo" in first_screen and "make test" in first_screen
    assert len(first_screen.splitlines()) <= 15


def test_the_license_is_mit_and_ships_in_the_wheel():
    assert PROJECT["license"] == "MIT"
    assert PROJECT["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    # PEP 639: the SPDX expression replaces the License classifier (setuptools refuses both).
    assert not [c for c in PROJECT["classifiers"] if c.startswith("License ::")]


def series(classifiers: list[str], prefix: str) -> list[tuple[int, int]]:
    found = [c.removeprefix(prefix) for c in classifiers if c.startswith(prefix)]
    return sorted((int(v.split(".")[0]), int(v.split(".")[1]))
                  for v in found if re.fullmatch(r"\d+\.\d+", v))


def test_the_classifiers_match_the_supported_versions():
    classifiers = PROJECT["classifiers"]
    pythons = series(classifiers, "Programming Language :: Python :: ")
    djangos = series(classifiers, "Framework :: Django :: ")
    # The lowest of each is the one the package requires and the linters target.
    assert f">={pythons[0][0]}.{pythons[0][1]}" == PROJECT["requires-python"]
    assert PYPROJECT["tool"]["ruff"]["target-version"] == f"py{pythons[0][0]}{pythons[0][1]}"
    django = next(d for d in PROJECT["dependencies"] if d.startswith("Django"))
    assert django == f"Django>={djangos[0][0]}.{djangos[0][1]}"
    # Every series CI runs is claimed, and no gap is left between the lowest and the highest.
    ci = (ROOT / ".ci/run").read_text()
    for major, minor in re.findall(r"DJANGO=(\d+)\.(\d+)", ci):
        assert (int(major), int(minor)) in djangos
    for major, minor in re.findall(r"python(\d+)\.(\d+)", ci):
        assert (int(major), int(minor)) in pythons
    assert pythons == [(3, m) for m in range(pythons[0][1], pythons[-1][1] + 1)]
    for needed in ("Framework :: Django", "Intended Audience :: Developers",
                   "Operating System :: POSIX", "Typing :: Typed"):
        assert needed in classifiers
    assert [c for c in classifiers if c.startswith("Development Status :: ")]
    assert PROJECT["keywords"] and PROJECT["authors"] and PROJECT["maintainers"]


def test_the_version_is_written_once_in_conf():
    # pyproject.toml reads conf.VERSION (setuptools' `attr`, read from the file); the built
    # wheel's metadata carries it (tests/release_check.py::wheel_problems).
    import django_xjobs

    assert "version" not in PROJECT and PROJECT["dynamic"] == ["version"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "django_xjobs.conf.VERSION"}
    assert django_xjobs.__version__ == conf.VERSION
    assert re.fullmatch(r"\d+\.\d+\.\d+", conf.VERSION)


def test_the_changelog_has_the_released_version_and_the_upgrade_policy():
    changelog = (ROOT / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## (.+)$", changelog, re.M)
    assert headings[0] == "Unreleased"
    assert [h for h in headings if h.split(" ")[0] == conf.VERSION], headings
    assert "versioning-and-upgrades" in github_anchors(changelog)
