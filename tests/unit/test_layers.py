"""The package's import structure: the layer contract covers every module, and an import
inside a function says why it is not at the top (docs/architecture.md, "Tiers")."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "django_xjobs"


def _layer_contract() -> dict:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    [layers] = [c for c in contracts if c["type"] == "layers" and "containers" not in c]
    return layers


def _top_level_modules() -> set[str]:
    """``django_xjobs.<name>`` of every module and subpackage directly in the package."""
    names = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    names |= {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    return {f"django_xjobs.{name}" for name in names}


def test_the_layer_contract_lists_every_module_of_the_package():
    listed = set()
    for layer in _layer_contract()["layers"]:
        listed.update(name.strip() for name in re.split(r"[|:]", layer))
    assert _top_level_modules() - listed == set(), "modules outside the layer contract"
    assert listed - _top_level_modules() == set(), "layers naming no module"


def _unexplained_imports(path: Path) -> list[str]:
    """The imports inside functions of ``path`` with no comment on their line or the line
    above."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for inner in ast.walk(node):
                if isinstance(inner, ast.Import | ast.ImportFrom):
                    here = lines[inner.lineno - 1]
                    above = lines[inner.lineno - 2] if inner.lineno > 1 else ""
                    if "#" not in here and not above.strip().startswith("#"):
                        found.append(f"{path.name}:{inner.lineno}: {ast.unparse(inner)}")
    return found


def test_every_import_inside_a_function_gives_its_reason():
    """An import belongs at the top of its module; one that must wait (a dependency that costs
    start-up and only some processes need, a module that Django's app loading or an older
    Django does not allow yet) carries a comment on its line or the line above saying which."""
    unexplained = [problem for path in sorted(PACKAGE.rglob("*.py"))
                   for problem in _unexplained_imports(path)]
    assert unexplained == []


def test_the_check_tells_an_explained_import_from_an_unexplained_one(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    import json\n    # why\n    import csv\n"
                      "    import re  # why\n    return json, csv, re\n")
    assert _unexplained_imports(module) == ["m.py:2: import json"]


def _string_imports(path: Path, root: Path = PACKAGE) -> list[str]:
    """The calls of ``import_module`` or ``__import__`` in ``path``: imports the contract
    cannot see."""
    found = []
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Call):
            called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(
                node.func, "id", None)
            # An installed app's own module (apps.py imports each app's tasks.py) is not one
            # of the package's: its line says so.
            if called in ("import_module", "__import__") and (
                    PROJECT_MODULE not in lines[node.lineno - 1]):
                found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


PROJECT_MODULE = "# an installed app's module, not the package's"


def test_no_module_of_the_package_is_imported_by_a_string():
    """Every dependency between the package's modules is an import statement, so the layer
    contract sees it. Migrations are the exception: their module names start with a digit, so
    one migration reaches another's functions only through ``import_module``."""
    found = [problem for path in sorted(PACKAGE.rglob("*.py"))
             if path.parent.name != "migrations" for problem in _string_imports(path)]
    assert found == []


def test_the_string_import_check_sees_both_spellings(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import importlib\nimportlib.import_module('x')\n__import__('y')\n")
    assert _string_imports(module, tmp_path) == ["m.py:2", "m.py:3"]
