"""Every python example of the documentation runs: each ```python block of each page of docs/
and of README.md (docs/development.md, "Documentation examples", is the writer's side of this).

One test per page. A page is a notebook: its blocks and its hidden ``<!-- setup``/``<!-- check``
blocks run in order in one namespace, as the module ``shop``, on the test database with
committing transactions (``transactional_db``), so ``drain()`` runs what the page enqueued
through the real worker loop. Each block is compiled under the page's own path with its lines
where they are on the page, so a traceback points into the page. After the page, what it
registered (jobs, backfills, ``django.tasks`` tasks, signal receivers, stand-in modules) is
taken back, so no page leaks into another or into the rest of the suite.
"""

from __future__ import annotations

import ast
import asyncio
import doctest
import inspect
import io
import itertools
import re
import sys
import traceback
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from _pytest.assertion.rewrite import rewrite_asserts

ROOT = Path(__file__).resolve().parents[2]

# Blocks marked <!-- not run: REASON --> across all pages, at most. Each is a block no setup
# could run here without faking the very thing it shows; at the time of writing:
# - docs/guide.md, "Typing": what a type checker reports; its calls fail at run time on purpose
#   (mypy checks the same calls in tests/typecheck/enqueue_calls.py, tests/unit/test_typing.py);
# - docs/observability.md, "OpenTelemetry": sets the process-wide MeterProvider, which a process
#   can set once and never take back, and exports over gRPC with an extra the tests do not
#   install (tests/integration/test_metrics.py runs install_otel on a provider of its own).
# A new marker needs its own line here and the allowance raised by one, in the same change.
NOT_RUN_ALLOWANCE = 2

PYTHON = frozenset({"python", "py"})
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([^`\s]*)")
HIDDEN = re.compile(r"^<!-- (setup|check)\s*$")
NOT_RUN = re.compile(r"^<!-- not run:(.*)-->\s*$")
FILE = re.compile(r"^<!-- file: (\S+) -->\s*$")
RAISES = re.compile(r"^<!-- raises: (\w+) -->\s*$")
# A line that looks like one of the markers above but is not one (a typo would otherwise hide a
# block from the reader and from the tests alike).
MARKER_LIKE = re.compile(r"^ {0,3}<!--\s*(setup|check|not[ -]run|file|raises)\b", re.I)
# The package the page's code runs as: @job names a job "shop.<function>", and ".models" is
# "shop.models".
MODULE = "shop"


class PageLayoutError(Exception):
    """A page whose markers or fences this harness cannot read as docs/development.md says."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Block:
    page: str  # path from the repository's root
    line: int  # the line of its fence (or of its <!-- setup / <!-- check)
    kind: str  # "python", "setup" or "check"
    source: str
    first: int  # the line of its first line of code
    not_run: str | None = None  # the reason given
    file: str | None = None  # the file of the repository it prints
    raises: str | None = None  # the name of the exception it shows


def pages() -> list[Path]:
    """README.md and every page of docs/, subdirectories included (not _build/ or .hidden)."""
    docs = ROOT / "docs"
    found = sorted(p for p in docs.rglob("*.md")
                   if not any(part.startswith(("_", ".")) for part in p.relative_to(docs).parts))
    return [ROOT / "README.md", *found]


def _closes(line: str, marks: str) -> bool:
    stripped = line.strip()
    return (len(stripped) >= len(marks) and set(stripped) == {marks[0]})


def parse(path: Path, text: str | None = None) -> list[Block]:
    """The python blocks and hidden blocks of a page, in order (of ``text``, when given)."""
    page = str(path.relative_to(ROOT))
    lines = (path.read_text() if text is None else text).splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        previous = lines[i - 1] if i else ""
        fence = FENCE.match(line)
        if fence:
            indent, marks, lang = fence.groups()
            end = i + 1
            while end < len(lines) and not _closes(lines[end], marks):
                end += 1
            if end == len(lines):
                raise PageLayoutError(f"{page}:{i + 1}: a fence that is never closed")
            not_run, quoted, raises = (NOT_RUN.match(previous), FILE.match(previous),
                                       RAISES.match(previous))
            if lang.lower() in PYTHON:
                if not_run and not not_run[1].strip():
                    raise PageLayoutError(f"{page}:{i}: <!-- not run: --> without a reason")
                body = [row[len(indent):] if row.startswith(indent) else row.lstrip()
                        for row in lines[i + 1:end]]
                blocks.append(Block(page=page, line=i + 1, kind="python",
                                    source="\n".join(body) + "\n", first=i + 2,
                                    not_run=not_run[1].strip() if not_run else None,
                                    file=quoted[1] if quoted else None,
                                    raises=raises[1] if raises else None))
            elif not_run or quoted or raises:
                raise PageLayoutError(f"{page}:{i}: a marker above a ```{lang} block, which is "
                                      "not run anyway")
            i = end + 1
            continue
        hidden = HIDDEN.match(line)
        if hidden:
            end = i + 1
            while end < len(lines) and lines[end].strip() != "-->":
                end += 1
            if end == len(lines):
                raise PageLayoutError(f"{page}:{i + 1}: <!-- {hidden[1]} never closed by a "
                                      "line -->")
            blocks.append(Block(page=page, line=i + 1, kind=hidden[1],
                                source="\n".join(lines[i + 1:end]) + "\n", first=i + 2))
            i = end + 1
            continue
        marker = NOT_RUN.match(line) or FILE.match(line) or RAISES.match(line)
        if MARKER_LIKE.match(line) and not marker:
            raise PageLayoutError(f"{page}:{i + 1}: {line.strip()!r} is not a marker of "
                                  'docs/development.md, "Documentation examples"')
        if marker and not FENCE.match(lines[i + 1] if i + 1 < len(lines) else ""):
            raise PageLayoutError(f"{page}:{i + 1}: a marker must be right above its block")
        i += 1
    return blocks


def _parsed(path: Path) -> list[Block] | PageLayoutError:
    try:
        return parse(path)
    except PageLayoutError as exc:
        return exc


PAGES = {str(p.relative_to(ROOT)): _parsed(p) for p in pages()}
# A page with nothing to run gets no test (and so no database); a page that cannot be read
# gets one, which fails with the reason.
RUNNABLE = sorted(page for page, blocks in PAGES.items()
                  if isinstance(blocks, PageLayoutError) or blocks)


# ------------------------------------------------------------------------------ running --


def _listing(block: Block) -> str:
    width = len(str(block.first + block.source.count("\n")))
    opening = "```python" if block.kind == "python" else f"<!-- {block.kind}"
    numbered = [f"{block.line:>{width}} | {opening}"]
    numbered += [f"{n:>{width}} | {text}"
                 for n, text in enumerate(block.source.splitlines(), start=block.first)]
    return "\n".join(numbered)


def _fail(block: Block, what: str, detail: str) -> None:
    where = "block" if block.kind == "python" else f"hidden {block.kind} block"
    pytest.fail(f"{block.page}:{block.line}: the {where} {what}\n\n{_listing(block)}\n\n{detail}",
                pytrace=False)


def _traceback_from_the_page(exc: BaseException, path: str) -> str:
    """The traceback from the page's own frame on: the harness's frames say nothing."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != path:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb or exc.__traceback__))


def _is_session(source: str) -> bool:
    code = [line for line in source.splitlines() if line.strip()]
    return bool(code) and code[0].startswith(">>> ")


def _run_session(block: Block, namespace: dict[str, Any]) -> None:
    """A block written as an interactive session runs as a doctest: its output must match."""
    path = str(ROOT / block.page)
    test = doctest.DocTestParser().get_doctest(block.source, namespace, block.page, path,
                                               block.first - 1)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report = io.StringIO()
    runner.run(test, out=report.write, clear_globs=False)
    if runner.failures:
        _fail(block, "printed something else", report.getvalue())


def _assigns(tree: ast.Module, name: str) -> bool:
    for node in tree.body:
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign))
                   else [])
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return True
    return False


def run_block(block: Block, namespace: dict[str, Any], config: Any = None) -> None:
    """Run one block in the page's namespace; fail the test, naming the page and the block's
    line, when it raises (or does not raise what its marker says)."""
    if _is_session(block.source):
        _run_session(block, namespace)
        return
    path = str(ROOT / block.page)
    # Padded so that the code's line numbers are the page's: tracebacks point into the page.
    padded = "\n" * (block.first - 1) + block.source
    try:
        tree = ast.parse(padded, path)
    except SyntaxError as exc:
        invalid = "".join(traceback.format_exception_only(exc))
    else:
        invalid = None
    if invalid is not None:  # failed outside the handler: no "during handling of" noise
        _fail(block, "is not valid Python", invalid)
    # pytest's own rewriting, so that a failed assert of a check block shows its values.
    rewrite_asserts(tree, padded.encode(), path, config)
    code = compile(tree, path, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)
    raised = None
    try:
        result = types.FunctionType(code, namespace)()
        if inspect.iscoroutine(result):  # a top-level await, as in python -m asyncio
            asyncio.run(result)
    except Exception as exc:
        raised = exc
    if block.raises is not None:
        _check_raised(block, raised, path)
    elif raised is not None:
        _fail(block, f"raised {type(raised).__name__}", _traceback_from_the_page(raised, path))
    if _assigns(tree, "XJOBS"):
        _check_xjobs(block, namespace["XJOBS"])


def _check_raised(block: Block, raised: Exception | None, path: str) -> None:
    """A block under <!-- raises: NAME --> must raise NAME (or a subclass); a comment in it that
    starts ``# NAME: `` and goes on over the comment lines below it is the message, word for
    word."""
    if raised is None:
        _fail(block, f"was to raise {block.raises}, and raised nothing", "")
        return
    if block.raises not in {cls.__name__ for cls in type(raised).__mro__}:
        _fail(block, f"was to raise {block.raises}, and raised {type(raised).__name__}",
              _traceback_from_the_page(raised, path))
    lines = block.source.splitlines()
    opening = f"# {block.raises}: "
    for n, line in enumerate(lines):
        if line.startswith(opening):
            printed = [line[len(opening):]]
            printed += [rest[2:] for rest in itertools.takewhile(
                lambda text: text.startswith("# "), lines[n + 1:])]
            if " ".join(printed).split() != str(raised).split():
                _fail(block, f"prints another message than its {block.raises}",
                      f"printed: {' '.join(printed)}\nraised:  {raised}")
            return


def _check_xjobs(block: Block, value: Any) -> None:
    from django_xjobs import conf

    problems = conf.validate(value)
    if problems:
        _fail(block, "assigns an XJOBS that django-xjobs refuses", "\n".join(problems))


STAND_INS: set[str] = set()  # the modules stand_in made, taken out of sys.modules after the page


def stand_in(name: str, **attributes: Any) -> types.ModuleType:
    """A module of the reader's project that a page imports (``from shop.models import Order``,
    ``from .models import User``), made of ``attributes``; gone after the page. A setup block
    calls it as ``stand_in("shop.models", Order=Order)``."""
    existing = sys.modules.get(name)
    if existing is not None and getattr(existing, "__spec__", None) is not None:
        raise ValueError(f"stand_in({name!r}): {name} is a real module")
    parts = name.split(".")
    for depth in range(1, len(parts) + 1):
        dotted = ".".join(parts[:depth])
        if dotted not in sys.modules:  # a real parent stays as it is, and unchanged
            module = sys.modules[dotted] = types.ModuleType(dotted)
            module.__path__ = []  # a package, so that its children import
            STAND_INS.add(dotted)
            parent = sys.modules.get(".".join(parts[:depth - 1]))
            if depth > 1 and getattr(parent, "__spec__", None) is None:
                setattr(parent, parts[depth - 1], module)
    module = sys.modules[name]
    vars(module).update(attributes)
    return module


def check_quoted_file(block: Block) -> None:
    """A block under <!-- file: PATH --> is that file of the suite, whole; the suite runs it."""
    assert block.file is not None
    path = (ROOT / block.file).resolve()
    if not path.is_relative_to(ROOT / "tests") or not path.is_file():
        _fail(block, f"quotes {block.file}, which is no file under tests/", "")
    if path.read_text() != block.source:
        _fail(block, f"differs from {block.file}, which it quotes", "")


@contextmanager
def isolated_page(namespace: dict[str, Any]) -> Iterator[None]:
    """Take back what the page's code registered in this process: its jobs, backfills and
    django.tasks tasks (those whose function the page defined: a job that a real module
    registered when the page first imported it stays, as that module stays imported), the
    receivers of django_xjobs' signals, and the modules stand_in made."""
    from django_xjobs import registry, signals
    from django_xjobs.backfills import registry as backfills

    def the_pages(definition: Any) -> bool:
        return getattr(definition.func, "__globals__", None) is namespace

    jobs, fills = registry.all_jobs(), backfills.all_backfills()
    heard = [(s, list(s.receivers)) for s in vars(signals).values() if hasattr(s, "receivers")]
    try:
        yield
    finally:
        for name, definition in backfills.all_backfills().items():
            if the_pages(definition):
                backfills.unregister(name)  # and the job that runs its passes
        try:
            from django_xjobs.tasks import declarations  # django.tasks: Django 6 and later
        except ImportError:
            declarations = None
        for name, definition in registry.all_jobs().items():
            if the_pages(definition):
                if declarations is not None and declarations.declared(name) is not None:
                    declarations.forget(name)
                registry.unregister(name)
        for name, definition in jobs.items():  # one a page's job replaced
            if registry.lookup(name) is None:
                registry.register(definition)
        for name, definition in fills.items():
            if backfills.lookup(name) is None:
                backfills.register(definition)
        for signal, receivers in heard:
            with signal.lock:
                signal.receivers[:] = receivers
                signal.sender_receivers_cache.clear()
        while STAND_INS:
            sys.modules.pop(STAND_INS.pop(), None)


# -------------------------------------------------------------------------------- tests --


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("page", RUNNABLE)
def test_the_examples_of_the_page_run(page: str, settings: Any, pytestconfig: Any) -> None:
    blocks = PAGES[page]
    if isinstance(blocks, PageLayoutError):
        pytest.fail(str(blocks), pytrace=False)
    namespace: dict[str, Any] = {"__name__": MODULE, "__package__": MODULE,
                                 "test_settings": settings, "stand_in": stand_in}
    with isolated_page(namespace):
        for block in blocks:
            if block.not_run is not None:
                continue
            if block.file is not None:
                check_quoted_file(block)
                continue
            run_block(block, namespace, pytestconfig)


def test_every_python_fence_of_every_page_is_collected() -> None:
    """The parser misses none: as many python blocks as lines that open a python fence."""
    for page, blocks in PAGES.items():
        if isinstance(blocks, PageLayoutError):
            continue  # its page's test fails with the reason
        opened = sum(1 for line in (ROOT / page).read_text().splitlines()
                     if (m := FENCE.match(line)) and m[3].lower() in PYTHON)
        assert sum(b.kind == "python" for b in blocks) == opened, (
            f"{page}: {opened} lines open a python fence, the harness read "
            f"{sum(b.kind == 'python' for b in blocks)} blocks (a python fence inside another "
            "fence is not a block)")
    assert sum(len(b) for b in PAGES.values() if not isinstance(b, PageLayoutError)) >= 50


def test_blocks_that_do_not_run_are_few_and_say_why() -> None:
    skipped = [f"{b.page}:{b.line}: {b.not_run}" for blocks in PAGES.values()
               if not isinstance(blocks, PageLayoutError) for b in blocks if b.not_run]
    assert len(skipped) <= NOT_RUN_ALLOWANCE, (
        f"{len(skipped)} blocks marked <!-- not run -->, {NOT_RUN_ALLOWANCE} allowed: make "
        "the new one run (a hidden setup block with a stand-in; docs/development.md, "
        '"Documentation examples") rather than raise the allowance:\n' + "\n".join(skipped))


# ------------------------------------------------------------------ the harness itself --

PAGE = '''Some prose.

<!-- setup
from django_xjobs import job
-->
```python
@job
def add(ctx, a, b): ...
```
<!-- raises: InvalidJobInput -->
```python
add.enqueue(c=1)
# InvalidJobInput: wrong words
```
<!-- not run: a reason -->
```python
this is not Python
```
```text
>>> not collected
```
'''


def test_a_page_is_read_as_its_blocks_with_their_markers_and_lines() -> None:
    blocks = parse(ROOT / "docs/example.md", PAGE)
    assert [(b.kind, b.line, b.first, b.raises, b.not_run) for b in blocks] == [
        ("setup", 3, 4, None, None),
        ("python", 6, 7, None, None),
        ("python", 11, 12, "InvalidJobInput", None),
        ("python", 16, 17, None, "a reason"),
    ]


@pytest.mark.parametrize("text", [
    "<!-- setup:\nx = 1\n-->\n",                 # misspelt: would hide the block
    "<!-- not run: a reason -->\n\n```python\nx\n```\n",  # not right above its block
    "<!-- not run: -->\n```python\nx\n```\n",   # no reason
    "<!-- not run: a reason -->\n```sh\nls\n```\n",  # not a python block
    "```python\nx = 1\n",                            # never closed
])
def test_a_marker_the_harness_cannot_read_fails_the_page(text: str) -> None:
    with pytest.raises(PageLayoutError):
        parse(ROOT / "docs/example.md", text)


def test_a_failure_names_the_page_and_line_and_shows_the_block() -> None:
    block = Block(page="docs/example.md", line=10, kind="python", first=11,
                  source="x = 1\nraise ValueError(f'boom {x}')\n")
    with pytest.raises(pytest.fail.Exception) as failed:
        run_block(block, {"__name__": MODULE})
    message = str(failed.value)
    assert message.startswith("docs/example.md:10: the block raised ValueError")
    assert "11 | x = 1" in message and "12 | raise ValueError" in message
    assert 'example.md", line 12' in message and "ValueError: boom 1" in message


def test_an_error_on_purpose_must_be_raised_with_the_words_the_page_prints() -> None:
    def block(source: str) -> Block:
        return Block(page="docs/example.md", line=1, kind="python", first=2,
                     source=source, raises="ZeroDivisionError")

    run_block(block("1 / 0\n# ZeroDivisionError: division by\n# zero\n"), {})
    for source in ("1 / 0\n# ZeroDivisionError: by nothing\n", "1 / 1\n", "int('x')\n"):
        with pytest.raises(pytest.fail.Exception):
            run_block(block(source), {})
