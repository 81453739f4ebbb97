"""``EnqueuedByMiddleware``: jobs enqueued while serving a request record its user.

Add ``"django_xjobs.middleware.EnqueuedByMiddleware"`` after ``AuthenticationMiddleware``;
jobs enqueued during a request by an authenticated user get ``enqueued_by = "user:<username>"``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .api import acting_as


class EnqueuedByMiddleware:
    """Jobs enqueued while serving a request of an authenticated user record
    ``enqueued_by = "user:<username>"``. Add ``"django_xjobs.middleware.EnqueuedByMiddleware"``
    to ``MIDDLEWARE`` after ``AuthenticationMiddleware``."""

    def __init__(self, get_response: Callable[[Any], Any]) -> None:
        self.get_response = get_response

    def __call__(self, request: Any) -> Any:
        user = getattr(request, "user", None)
        if user is not None and getattr(user, "is_authenticated", False):
            with acting_as(f"user:{user.get_username()}"):
                return self.get_response(request)
        return self.get_response(request)
