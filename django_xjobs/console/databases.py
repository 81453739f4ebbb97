"""Which database a console request reads and writes (docs/scaling.md).

Every page of the console runs inside :func:`for_request`:

* **The shard.** With the jobs sharded by tenant (``XJOBS["SHARDS"]``) a page shows one shard:
  the one chosen with ``?shard=<alias>`` (any page; kept in the session, the parameter itself
  dropped by a redirect so that no admin filter sees it), else the home shard. Every read and
  every action of the request goes to that shard's database.
* **The replica.** A page's reads go to the shard's streaming replica
  (``XJOBS["READ_DATABASE"]``) while it is fresh enough: see :mod:`django_xjobs.replica`. A POST
  (every action, every confirmation) stays on the primary, and so do the pages of
  :data:`PRIMARY_PAGES`, which show the primary's own state. After a POST the primary's WAL
  position goes into the session (:data:`WRITTEN_KEY`, per jobs alias): the operator's next
  pages read the replica only once it has replayed that far, so they never show the state
  before their own change.

What was chosen is on the request (``request.xjobs_shard``, ``request.xjobs_reads``) for the
page's header to say.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from typing import Any

from django.contrib import messages
from django.db import DatabaseError, transaction
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect

from .. import conf, replica

SESSION_KEY = "django_xjobs_shard"
PARAMETER = "shard"
# The session's jobs alias -> the primary's WAL position after the operator's last change there.
WRITTEN_KEY = "django_xjobs_written"
SAFE_METHODS = ("GET", "HEAD")
# The pages (URL names) that read the primary whatever the method, and why.
PRIMARY_PAGES = {
    "django_xjobs_health": "the health panel shows the primary's own state (what holds its "
                           "VACUUM back, its tables' dead rows), which a standby does not have",
}


# The hidden field of every console form naming the shard its page showed: a POST acts there,
# whatever another tab has chosen since (templatetags: xjobs_shard_field).
SHARD_FIELD = "_xjobs_shard"


def chosen_shard(request: HttpRequest) -> str | None:
    """The shard this request shows, or acts on (None when the jobs are not sharded): a form's
    own shard, else the session's, else the home shard."""
    settings = conf.get()
    if not settings.shards:
        return None
    posted = request.POST.get(SHARD_FIELD) if request.method == "POST" else None
    if posted in settings.shards:
        return posted
    session = getattr(request, "session", None)
    alias = session.get(SESSION_KEY) if session is not None else None
    return alias if alias in settings.shards else settings.home_database


def _choose(request: HttpRequest) -> HttpResponse | None:
    """``?shard=`` on any page: remember it and redirect to the page without it."""
    if PARAMETER not in request.GET:
        return None
    settings = conf.get()
    alias = request.GET[PARAMETER]
    if settings.shards and alias in settings.shards and hasattr(request, "session"):
        request.session[SESSION_KEY] = alias
    elif not settings.shards:
        messages.error(request, "The jobs are not sharded (XJOBS[\"SHARDS\"] is not set): "
                       "every page shows the one database.")
    else:
        messages.error(request, f"No shard {alias!r}: the shards are "
                       f"{', '.join(settings.job_databases)}.")
    rest = request.GET.copy()
    del rest[PARAMETER]
    query = rest.urlencode()
    return HttpResponseRedirect(request.path + (f"?{query}" if query else ""))


@contextmanager
def for_request(request: HttpRequest, *, failed: str | None = None) -> Iterator[None]:
    """The request's shard, and its reads on the replica when they may be (module docstring);
    on the primary when the replica ``failed`` during this page (why, in words)."""
    shard = chosen_shard(request)
    request.xjobs_shard = shard  # type: ignore[attr-defined]
    session = getattr(request, "session", None)
    written = dict(session.get(WRITTEN_KEY) or {}) if session is not None else {}
    page = getattr(getattr(request, "resolver_match", None), "url_name", None)
    safe = request.method in SAFE_METHODS
    because = failed or (PRIMARY_PAGES.get(page or "") if safe
                         else "a change is made on the primary")
    with conf.using_database(shard):
        alias = conf.get().database
        with replica.reads(enabled=because is None, after_lsn=written.get(alias),
                           primary_because=because) as source:
            if failed and source.replica is not None:
                source = dataclasses.replace(source, fell_back=True)  # a warning, not a choice
            request.xjobs_reads = source  # type: ignore[attr-defined]
            if source.on_replica and alias in written and session is not None:
                del written[alias]  # replayed: the replica shows the change
                session[WRITTEN_KEY] = written
            try:
                yield
            finally:
                if not safe and session is not None:
                    # After the commit (at once outside a transaction; with ATOMIC_REQUESTS when
                    # the view's transaction commits), so that the position covers the change.
                    transaction.on_commit(lambda: _remember_change(session, alias),
                                          using=alias)


def _remember_change(session: Any, alias: str) -> None:
    """The primary's WAL position now, in the session, for the next pages (module docstring)."""
    position = replica.written_position(alias)
    if position is not None:
        session[WRITTEN_KEY] = {**(session.get(WRITTEN_KEY) or {}), alias: position}


def in_request_database(view: Callable[..., Any]) -> Callable[..., Any]:
    """``view`` run in :func:`for_request`, its response rendered there (a template response
    renders after the view returns, and must read where the view did)."""
    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        redirect = _choose(request)
        if redirect is not None:
            return redirect
        try:
            with for_request(request):
                return _rendered(view(request, *args, **kwargs))
        except DatabaseError as exc:
            source = getattr(request, "xjobs_reads", None)
            if source is None or not source.on_replica or request.method not in SAFE_METHODS:
                raise
            # The replica failed during the page (gone, or a query cancelled by replay): the
            # page is read again on the primary, and says so; the next page probes afresh.
            replica.forget()
            because = f"replica {source.alias} failed during the page: {replica.first_line(exc)}"
        with for_request(request, failed=because):
            return _rendered(view(request, *args, **kwargs))
    return wrapped


def _rendered(response: Any) -> Any:
    if hasattr(response, "render") and not getattr(response, "is_rendered", True):
        response.render()
    return response
