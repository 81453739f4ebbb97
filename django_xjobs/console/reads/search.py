"""Finding a job by what it is about: a value in its input, words of its input or its error,
its name (or a pattern of names), its worker (docs/console.md, "Finding the job").

One set of conditions serves the console's job list (the search box and the filters beside
it), ``manage.py xjobs jobs`` and the operator actions over a filter, so all three find the
same jobs. Each condition is written the way an index answers it:

* the words of a job's input values and those of its last error are the expressions of
  ``<history table>_input_words_idx`` and ``_error_words_idx`` (:data:`INPUT_WORDS`,
  :data:`ERROR_WORDS`), GIN indexes every history table has; a value at a path
  (``order_id=42``) is the input's words narrowed by JSON containment
  (``input @> '{"order_id": 42}'``), which the index's candidates are re-checked against;
* a name (or a pattern of names), a queue, a tenant, a worker are the history tables' b-tree
  indexes on the column and ``id``, read newest first.

``x_jobs`` itself has none of these indexes (every index there is written by each claim and
acknowledgement): a search reads its rows, which the archive keeps to the live jobs and those
finished in the last ``ARCHIVE_AFTER``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from django.core.exceptions import EmptyResultSet
from django.db import connections, transaction
from django.db.models import BooleanField, F, Q, TextField
from django.db.models.expressions import RawSQL
from django.db.models.functions import Cast, Now

from ... import conf
from ...exceptions import ConfigurationError
from ...models import RUN_ID_APART, Job
from ...records import ALL_STATES
from .scope import scoped

# The words of a job's input values (strings and numbers, at any depth; not the keys) and of its
# last error, in the 'simple' configuration: lower-cased, no stemming, no stop words, so an
# order number, an e-mail address or an exception's name is a word as it is written. The
# history tables' indexes are on exactly these expressions (migration 0016, the error's partial
# to rows with an error): the planner matches an index by its expression and its condition.
INPUT_WORDS = "jsonb_to_tsvector('simple'::regconfig, input, '[\"string\", \"numeric\"]'::jsonb)"
ERROR_WORDS = "to_tsvector('simple'::regconfig, last_error)"

# A path into the input, then "=" and the value: ``order_id=42``, ``customer.email=a@b.c``.
_PATH_VALUE = re.compile(r"^\s*([A-Za-z_$][\w$-]*(?:\.[\w$-]+)*)\s*=\s*(.*?)\s*$", re.S)
# A pattern of names: ``*`` any run of characters, ``?`` one.
_GLOB = re.compile(r"[*?]")


@dataclass(frozen=True, slots=True)
class InputValue:
    """``path=value`` of a search: the path's keys, and the JSON values that count as equal
    (``42`` finds the number 42 and the string "42"; ``"42"`` only the string)."""

    path: tuple[str, ...]
    values: tuple[Any, ...]

    def containment(self) -> Q:
        q = Q()
        for value in self.values:
            doc: Any = value
            for key in reversed(self.path):
                doc = {key: doc}
            q |= Q(input__contains=doc)
        return q


def parse_input_value(text: str) -> InputValue | None:
    """``path=value`` as an :class:`InputValue`, or None when ``text`` is not of that form."""
    found = _PATH_VALUE.match(text)
    if found is None:
        return None
    path, raw = found.group(1), found.group(2)
    if raw == "":
        return None
    try:
        decoded = json.loads(raw)
    except ValueError:
        decoded = raw  # a bare word: the string itself
    values: list[Any] = [decoded]
    if isinstance(decoded, int | float) and not isinstance(decoded, bool):
        values.append(raw)  # order_id=42 finds {"order_id": "42"} too
    elif isinstance(decoded, str) and decoded == raw:
        number = _number(raw)
        if number is not None:
            values.append(number)
    return InputValue(path=tuple(path.split(".")), values=tuple(values))


def _number(text: str) -> int | float | None:
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value == value and value not in (float("inf"), float("-inf")) else None


def has_words(text: str, using: str = "default") -> bool:
    """Whether ``text`` has a word the index knows (``plainto_tsquery`` of it is not empty): a
    search without one (punctuation, a blank) cannot be answered by the words index."""
    with connections[using].cursor() as cur:
        cur.execute("select numnode(plainto_tsquery('simple', %s)) > 0", [text])
        row = cur.fetchone()
    return bool(row and row[0])


def input_words(text: str) -> Q:
    """Every word of ``text`` among the words of the input's values."""
    return Q(RawSQL(f"{INPUT_WORDS} @@ plainto_tsquery('simple', %s)", [text],
                    output_field=BooleanField()))


def error_words(text: str) -> Q:
    """Every word of ``text`` among the words of the last error."""
    return Q(last_error__isnull=False) & Q(RawSQL(
        f"{ERROR_WORDS} @@ plainto_tsquery('simple', %s)", [text], output_field=BooleanField()))


def run_id_match(run_id: UUID) -> Q:
    """A run-id condition that every row meets through an index, never a table scan.

    ``x_jobs.run_id`` has no index over all rows (each index on x_jobs costs every claim and ack
    a write). But the API mints a job's id and run id in one ``new_ids`` call, so both UUIDv7s
    carry the same millisecond: such a job is in the primary-key range of its run id's
    millisecond. Every other row (written by hand, with random uuids) is in
    ``x_jobs_run_apart_idx``, whose condition is that the two differ; the API's rows never
    enter it. ``tests/integration/test_console_admin.py`` pins both paths, and
    ``tests/integration/test_console_plans.py`` the plan of a run id nothing has.
    """
    ms = run_id.int >> 80
    low, high = UUID(int=ms << 80), UUID(int=((ms + 1) << 80) - 1)
    return Q(run_id=run_id, id__gte=low, id__lte=high) | (Q(run_id=run_id) & RUN_ID_APART)


def uuid_search(uid: UUID) -> Q:
    """What the search box finds for a uuid: the job, the jobs of that run, a job keyed by
    it."""
    by_key = Q(idempotency_key=str(uid)) & ~Q(idempotency_key=Cast(F("id"), TextField()))
    return Q(id=uid) | by_key | run_id_match(uid)


def text_search(term: str, using: str = "default") -> Q:
    """What the search box finds for a term that is not a job id: the idempotency key itself,
    a value at a path of the input (``order_id=42``), or jobs whose input values or last error
    hold every word of it."""
    term = term.strip()
    # The same condition as the partial key index's, so the planner can use it.
    found = Q(idempotency_key=term) & ~Q(idempotency_key=Cast(F("id"), TextField()))
    value = parse_input_value(term)
    if value is not None:
        contained = value.containment()
        first = value.values[0]
        # Narrowed by the words index, then re-checked, when the value is one the index holds
        # as written: a string or an integer. A boolean, a null, an object or an array has no
        # such words (the index has strings' and numbers' only), and a fraction's text is not
        # jsonb's (1.5 finds 1.50): containment alone finds them.
        if isinstance(first, str | int) and not isinstance(first, bool):
            words = str(first)
            if has_words(words, using):
                contained = input_words(words) & contained
        return found | contained
    if has_words(term, using):
        found |= input_words(term) | error_words(term)
    return found


def error_search(text: str, using: str = "default") -> Q:
    """Jobs whose last error holds every word of ``text`` (``card declined``)."""
    if not has_words(text, using):
        raise ConfigurationError(f"error search {text!r} has no word to look for")
    return error_words(text)


def is_pattern(name: str) -> bool:
    """Whether a name filter is a pattern (``*``, ``?``) rather than one name."""
    return bool(_GLOB.search(name))


def name_match(pattern: str) -> Q:
    """A job name, or a pattern of names with ``*`` (any characters) and ``?`` (one):
    ``shop.*`` is every name under ``shop.``."""
    pattern = pattern.strip()
    if not _GLOB.search(pattern):
        return Q(name=pattern)
    like = "".join("%" if c == "*" else "_" if c == "?" else
                   "\\" + c if c in "%_\\" else c for c in pattern)
    # The history tables' index on name is text_pattern_ops: it answers the pattern's literal
    # prefix whatever the database's collation.
    return Q(RawSQL("name like %s", [like], output_field=BooleanField()))


def worker_match(worker: str) -> Q:
    """Jobs a worker ran last: its id (``web-1:4242``) or every worker of a host (``web-1``)."""
    worker = worker.strip()
    if ":" in worker:
        return Q(claimed_by=worker)
    like = "".join("\\" + c if c in "%_\\" else c for c in worker)
    return Q(RawSQL("claimed_by like %s", [f"{like}:%"], output_field=BooleanField()))


# --------------------------------------------------------------------- newest, table by table --

_SEARCHED = "_xjobs_searched"
# Matches a table may have for newest_per_table to read them all in no order (through the
# index) rather than walk its primary key: more, and they are dense there.
SPARSE = 1000


def mark_searched(request: Any) -> None:
    """Tell the jobs list that a condition of this module narrows it: it is then read table
    by table (:func:`newest_per_table`)."""
    setattr(request, _SEARCHED, True)


def searched(request: Any) -> bool:
    return bool(getattr(request, _SEARCHED, False))


HISTORY_TABLES_SQL = """
select c.relname::text
  from pg_inherits i join pg_class c on c.oid = i.inhrelid
 where i.inhparent = 'x_jobs'::regclass
 order by 1
"""


def _table_query(queryset: Any, columns: list[str], limit: int | None,
                 ordered: bool) -> tuple[str, list[Any], str] | None:
    """``queryset``'s query (its first ``limit`` rows, newest first when ``ordered``) with a
    marker where the table's name goes; None when it cannot be split by table (a join or a
    subquery of the same table)."""
    inner = (queryset.order_by("-id") if ordered else queryset.order_by()).values(*columns)
    if limit is not None:
        inner = inner[:limit]
    try:
        sql, params = inner.query.get_compiler(using=queryset.db).as_sql()
    except EmptyResultSet:  # queryset.none() (an error filter without a word): no query
        return None
    table = queryset.model._meta.db_table
    marker = f'FROM "{table}"'
    if sql.count(marker) != 1:
        return None
    return sql, list(params), marker


@contextmanager
def _reading(using: str) -> Iterator[Any]:
    """A cursor whose statements skip a history table that their conditions on ``state``
    exclude (its CHECK constraint names its one state): PostgreSQL does that by itself for the
    tables of an inheritance tree queried through its parent, not for a table named alone,
    unless ``constraint_exclusion`` is ``on`` (for this transaction only)."""
    with transaction.atomic(using=using), connections[using].cursor() as cur:
        # And no JIT: the union's cost, summed over every table, passes jit_above_cost, and
        # compiling it (150 ms at ten million jobs) costs more than the reads it would speed.
        cur.execute("set local constraint_exclusion = on; set local jit = off")
        yield cur


def _tables(queryset: Any) -> list[str]:
    """``x_jobs`` and its history tables."""
    with connections[queryset.db].cursor() as cur:
        cur.execute(HISTORY_TABLES_SQL)
        return [queryset.model._meta.db_table, *(row[0] for row in cur.fetchall())]


def newest_per_table(queryset: Any, *, limit: int) -> Any:
    """``queryset`` narrowed to its newest ``limit`` rows (by id), found table by table
    (docs/performance.md, "The console at ten million jobs").

    Why: a search's matches are spread unevenly over the tables (an error's words are in the
    dead jobs' tables only; a job's order number in one table), and the planner's guess for a
    word it has no statistics for is one row in two hundred. Planned as one query over the
    inheritance tree, it gives every table the same share of the ``LIMIT`` and walks a table's
    primary key newest first where the words are absent, reading all of it (3.6 s for a dead
    jobs' error at two million jobs). So the tables are read one by one, the newest first (by
    their greatest id), each by one of two bounded reads:

    * while fewer than ``limit`` rows are found, its matches in no order, up to a cap (the
      words index or the b-tree answers them): all of them when there are fewer than the cap;
      else the matches are dense in this table and its newest ``limit`` are read from its
      primary key, which meets one every few rows;
    * once ``limit`` are found, only rows newer than the last of them can change the list: the
      table is read above that id, or skipped when its greatest id is below it (and so are the
      older ones after it).

    The list then reads those ids, given as a list the planner sees, by primary key.
    """
    split = _table_query(queryset, ["id"], None, ordered=False)
    if split is None:
        return queryset
    cap = max(SPARSE + 1, limit + 1)
    with _reading(queryset.db) as cur:
        # Each table's greatest id, from its primary key; an empty table is left out. (The
        # union in a subquery: one table alone, "(select ... limit 1) order by 1" is an error.)
        names = _tables(queryset)
        cur.execute("select * from (" + " union all ".join(
            f"(select id, %s from only \"{name}\" order by id desc limit 1)"
            for name in names) + ") t order by 1 desc", names)
        tables = cur.fetchall()
        found: list[Any] = []
        for top, name in tables:
            bound = found[limit - 1] if len(found) >= limit else None
            if bound is not None and top <= bound:
                break  # this table and every one after it hold only older rows
            narrowed = queryset if bound is None else queryset.filter(id__gt=bound)
            rows = None
            if bound is None:
                rows = _read(cur, narrowed, name, cap, ordered=False)
                if len(rows) >= cap:  # dense here: its newest from the primary key
                    rows = None
            if rows is None:
                rows = _read(cur, narrowed, name, limit, ordered=True)
            found = sorted(set(found).union(rows), reverse=True)[:limit]
    return queryset.filter(id__in=found)


def _read(cur: Any, queryset: Any, table: str, limit: int, *, ordered: bool) -> list[Any]:
    split = _table_query(queryset, ["id"], limit, ordered=ordered)
    assert split is not None  # the caller's queryset split; a narrower one does too
    sql, params, marker = split
    cur.execute(sql.replace(marker, f'FROM ONLY "{table}" AS "{queryset.model._meta.db_table}"'),
                params)
    return [row[0] for row in cur.fetchall()]


def count_per_table(queryset: Any, *, cap: int) -> int:
    """How many rows ``queryset`` has, up to ``cap``, counted table by table (each table's
    plan its own, as in :func:`newest_per_table`), in no order: the tables are read one after
    the other until ``cap`` rows are found."""
    split = _table_query(queryset, ["id"], cap, ordered=False)
    if split is None:
        return min(cap, queryset.order_by()[:cap].count())
    sql, params, marker = split
    table = queryset.model._meta.db_table
    parts = [sql.replace(marker, f'FROM ONLY "{t}" AS "{table}"') for t in _tables(queryset)]
    params = params * len(parts)
    union = " UNION ALL ".join(f"({p})" for p in parts)
    with _reading(queryset.db) as cur:
        cur.execute(f"select count(*) from (select 1 from ({union}) u limit {int(cap)}) c",
                    params)
        return int(cur.fetchone()[0])


# ------------------------------------------------------------------ the list's filters, by name --

# The jobs list's filters by the names of the console's URL (``?state=dead&error=declined``),
# which ``manage.py xjobs jobs`` and ``xjobs retry --filter`` take too: a filter copied from
# the browser's address bar means the same jobs in a terminal.
FILTERS = ("state", "queue", "name", "tenant", "worker", "error", "q")
LAPSED = "lapsed"  # the state filter's "running, lease expired"


def filtered_jobs(filters: Mapping[str, str | None], *, tenants: Any = None,
                  using: str | None = None) -> tuple[Any, bool]:
    """The jobs ``filters`` (a mapping of :data:`FILTERS` names to values) match, newest
    first, and whether one of them is a search (to be read table by table:
    :func:`newest_per_table`), on ``using`` (default: the jobs alias in use: a shard, or the
    replica a report reads). An unknown name, or a state that is none, is a
    :class:`ConfigurationError` naming the ones there are."""
    using = using or conf.get().database
    unknown = sorted(set(filters) - set(FILTERS))
    if unknown:
        raise ConfigurationError(f"unknown job filter(s) {unknown}; the filters are "
                                 f"{', '.join(FILTERS)}")
    qs = scoped(Job.objects.using(using).all(), tenants)
    searched = False
    for key in FILTERS:
        value = (filters.get(key) or "").strip()
        if not value:
            continue
        if key == "state":
            if value == LAPSED:
                qs = qs.filter(state="running", visible_at__lte=Now())
            elif value in ALL_STATES:
                qs = qs.filter(state=value)
            else:
                raise ConfigurationError(f"state {value!r} is none of {', '.join(ALL_STATES)} "
                                         f"or {LAPSED}")
        elif key == "queue":
            qs = qs.filter(queue=value)
        elif key == "tenant":
            qs = qs.filter(tenant_id=value)
        elif key == "name":
            qs = qs.filter(name_match(value))
            searched |= is_pattern(value)
        elif key == "worker":
            qs, searched = qs.filter(worker_match(value)), True
        elif key == "error":
            qs, searched = qs.filter(error_search(value, using)), True
        else:
            uid = _as_uuid(value)
            qs = qs.filter(uuid_search(uid) if uid else text_search(value, using))
            searched = True
    return qs.order_by("-id"), searched


def _as_uuid(value: str) -> UUID | None:
    try:
        return UUID(value)
    except ValueError:
        return None
