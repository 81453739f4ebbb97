"""The console's paginator: no exact ``count(*)`` of a big table, no page past
:data:`MAX_PAGES` (docs/console.md, "At ten million jobs").

It counts exactly up to :data:`EXACT_COUNT_LIMIT` rows and estimates beyond (the planner's row
estimate, from ``pg_class.reltuples``); a list ordered by a "created" or "run at" range is read
window by window (:class:`EstimatedCountPaginator`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

from django.core.paginator import Paginator
from django.db.models.lookups import (
    GreaterThan,
    GreaterThanOrEqual,
    LessThan,
    LessThanOrEqual,
)
from django.utils import timezone
from django.utils.functional import cached_property

# Counted exactly up to this many rows, estimated beyond; and no page past MAX_PAGES (an OFFSET
# of a hundred thousand rows is already slow; narrow the list with a filter instead).
EXACT_COUNT_LIMIT = 1000
MAX_PAGES = 1000


def _planner_rows(queryset: Any) -> int:
    """The planner's estimate of the rows ``queryset`` matches (from ``pg_class.reltuples`` and
    the column statistics): EXPLAIN plans the query and runs nothing."""
    try:
        plan = queryset.order_by().explain(format="json")
        return int(json.loads(plan)[0]["Plan"]["Plan Rows"])
    except (ValueError, KeyError, IndexError, TypeError):
        return 0


class EstimatedCountPaginator(Paginator):
    """Exact counts for small results, the planner's estimate for big ones: never a full
    ``count(*)`` of a big table, which reads every row on every page view
    (docs/performance.md, "What the simpler forms cost"). ``estimated`` tells the template to
    say "about".

    A list ordered newest first by a column of :data:`WINDOWED` (the jobs list with a "created"
    or "run at" range: ``JobAdmin.get_ordering``) is counted and paged window by window: the
    rows since ``start - span``, the span growing until the window holds the page (or more
    rows than are counted exactly) or covers the range. The rows of a window precede every row
    outside it in that order, so its page is the whole range's page, and a window that holds
    more than the limit tells that the range does; but a window reads only the table pages the
    BRIN summary of ``x_jobs_console_brin`` places in it. The whole range (a day of history is
    a seventh of the table at ten million jobs) would be sorted to show fifty rows, and its
    count, a scan that stops at the limit, would read the table from its start up to the
    range's first row."""

    estimated = False
    at_least = False  # the count is a floor: a search counted up to EXACT_COUNT_LIMIT + 1

    def counted_already(self, rows: int) -> None:
        """The list's rows, counted by its caller up to EXACT_COUNT_LIMIT + 1 (a search read
        table by table: JobChangeList): no window, no estimate; past the limit the count is
        said to be a floor."""
        self.__dict__["counted"] = {WINDOW_ROUNDS: rows}
        if rows > EXACT_COUNT_LIMIT:
            self.at_least = True
            self.__dict__["count"] = rows

    @cached_property
    def counted(self) -> dict[int, int]:
        """Rows of every other window (k -> rows, up to EXACT_COUNT_LIMIT + 1), until one holds
        more than the limit, or up to the whole list (k = WINDOW_ROUNDS)."""
        counted = {}
        for k, part in self._windows(every=2):
            # Unordered: any EXACT_COUNT_LIMIT + 1 rows tell "more than the limit" as well as
            # the first ones in the list's order would, without sorting every match first.
            counted[k] = part.order_by()[: EXACT_COUNT_LIMIT + 1].count()
            if counted[k] > EXACT_COUNT_LIMIT:
                break
        return counted

    @cached_property
    def count(self) -> int:  # type: ignore[override]
        bounded = self.counted[max(self.counted)]
        if bounded <= EXACT_COUNT_LIMIT:
            return bounded  # of the whole list: only a window holding more ends the counting
        self.estimated = True
        return max(bounded, _planner_rows(self.object_list))

    @cached_property
    def num_pages(self) -> int:  # type: ignore[override]
        if self.count == 0 and not self.allow_empty_first_page:
            return 0
        hits = max(1, self.count - self.orphans)
        return min(MAX_PAGES, math.ceil(hits / self.per_page))

    def page(self, number: Any) -> Any:
        number = self.validate_number(number)
        bottom = (number - 1) * self.per_page
        top = bottom + self.per_page
        if top + self.orphans >= self.count:
            top = self.count
        counted = self.counted
        for k, part in self._windows(every=1):
            # The rows of the smallest window counted that contains this one (None: past them).
            rows_in = next((counted[j] for j in sorted(counted) if j >= k), None)
            if rows_in is not None and rows_in <= EXACT_COUNT_LIMIT and (
                    rows_in < top or k not in counted):
                continue  # too few rows for the page, or a window counted holds it: read that
            rows = list(part[bottom:top])
            if len(rows) >= top - bottom:
                break
        return self._get_page(rows, number, self)

    def _windows(self, every: int) -> Iterator[tuple[int, Any]]:
        """``(k, the list narrowed to window k)`` for every ``every``-th window (none unless the
        list is ordered by a column of WINDOWED), then ``(WINDOW_ROUNDS, the whole list)``."""
        field = _windowed_order(self.object_list)
        if field is not None:
            # Windows end at the range's end or now, whichever is earlier (a range ending later
            # today holds nothing after now but delayed jobs, and those are in every window).
            highest = _bound(self.object_list, field, (LessThan, LessThanOrEqual), min)
            start = min(highest, timezone.now()) if highest is not None else timezone.now()
            lowest = _bound(self.object_list, field, (GreaterThan, GreaterThanOrEqual), max)
            for k in range(0, WINDOW_ROUNDS, every):
                since = start - WINDOW_FIRST * WINDOW_GROWTH ** k
                if lowest is not None and since <= lowest:
                    break  # the window holds the whole range: the whole list is the same
                yield k, self.object_list.filter(**{f"{field}__gte": since})
        yield WINDOW_ROUNDS, self.object_list


# The columns a list may be read window by window in (see EstimatedCountPaginator): each is in
# x_jobs_console_brin. Window k spans WINDOW_FIRST * WINDOW_GROWTH ** k: a minute, then 4 times
# longer each, up to about two years (1 min, 4 min, 16 min, 1.1 h, 4.3 h, 17 h, 2.8 d, ...,
# 2 y), then the whole range. The count reads every other one (16 times longer each); a page
# reads the window counted that holds it, or, when that one holds more than the count's limit
# (a quiet hour before a busy one), the window between first: a quarter of it.
WINDOWED = ("created_at", "run_at")
WINDOW_FIRST = timedelta(minutes=1)
WINDOW_GROWTH = 4
WINDOW_ROUNDS = 11


def _windowed_order(queryset: Any) -> str | None:
    """The column of :data:`WINDOWED` a queryset is ordered by, newest first, or None."""
    order = getattr(getattr(queryset, "query", None), "order_by", ())
    first = order[0] if order and isinstance(order[0], str) else ""
    return first[1:] if first.startswith("-") and first[1:] in WINDOWED else None


def _bound(queryset: Any, field: str, lookups: tuple[type, ...],
           pick: Callable[[list[datetime]], datetime]) -> datetime | None:
    """The tightest bound on ``field`` of the given comparisons among the conditions every row
    of ``queryset`` meets (its top-level AND), or None."""
    where = queryset.query.where
    if where.connector != "AND" or where.negated:
        return None
    bounds = []
    for child in where.children:
        rhs: Any = getattr(child, "rhs", None)
        target = getattr(getattr(child, "lhs", None), "target", None)
        if isinstance(child, lookups) and isinstance(rhs, datetime) \
                and getattr(target, "name", None) == field:
            bounds.append(rhs)
    return pick(bounds) if bounds else None
