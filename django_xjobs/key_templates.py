"""Key templates: how ``Concurrency(key=...)`` and ``RateLimit(key=...)`` turn a job's input into
the key its limit counts on (docs/concurrency.md, docs/flow-control.md).

A template is formatted at enqueue from the job's input and its ``tenant_id``:
``"tenant:{tenant_id}"``, ``"export:{account_id}"``, or a constant (``"smtp"``). Fields are plain
names (``{name}``; no attributes, indexes, conversions or format specs); a field's value must be
a string, an integer, or one of the typed values a job's input may hold (a datetime, date, time,
UUID or Decimal), written as ``str()`` writes it (``"{when}"`` gives ``2024-05-01 12:00:00+00:00``,
``"{id}"`` the hyphenated UUID, ``"{amount}"`` the Decimal's own digits). A key is a non-empty
string of at most 500 characters, valid UTF-8, without NUL.
"""

from __future__ import annotations

import inspect
import string
from collections.abc import Callable, Mapping
from typing import Any

from .conf import MAX_SLOT_KEY
from .exceptions import ConfigurationError, InvalidJobInput
from .values import TYPED_TYPES, is_utf8, safe_repr

TENANT_FIELD = "tenant_id"
# What a field may hold: text, an integer, or a typed value of the input (values.TYPED_TYPES).
_FIELD_TYPES = (str, int, *TYPED_TYPES)


class KeyTemplate:
    """A parsed key template. ``what`` names the option in errors ("concurrency key")."""

    __slots__ = ("_parts", "error", "template", "what")

    def __init__(self, template: Any, *, what: str, owner: str,
                 error: type[InvalidJobInput]) -> None:
        if not isinstance(template, str) or not template or "\x00" in template:
            raise ConfigurationError(
                f"{owner}(key=...) must be a non-empty key template without NUL, got "
                f"{template!r:.80}"
            )
        try:
            parsed = list(string.Formatter().parse(template))
        except ValueError as exc:
            raise ConfigurationError(
                f"{owner} key template {template!r} is not valid: {exc} (write a literal brace "
                "as {{ or }})"
            ) from None
        parts: list[tuple[str, str | None]] = []
        for literal, name, spec, conversion in parsed:
            if name is not None and (not name.isidentifier() or spec or conversion):
                raise ConfigurationError(
                    f"{owner} key template {template!r}: {{{name}"
                    f"{'!' + conversion if conversion else ''}{':' + spec if spec else ''}}} "
                    "is not a plain field; use {name} with a name of the job's input or "
                    "{tenant_id}"
                )
            parts.append((literal, name))
        self.template = template
        self.what = what
        self.error = error
        self._parts = tuple(parts)

    @property
    def fields(self) -> tuple[str, ...]:
        """The field names of the template, in order."""
        return tuple(name for _, name in self._parts if name is not None)

    @property
    def prefix(self) -> str:
        """The literal text before the first field: every key of this template starts with it."""
        out = []
        for literal, name in self._parts:
            out.append(literal)
            if name is not None:
                break
        return "".join(out)

    def format(self, values: Mapping[str, Any], *, tenant_id: str | None = None,
               job: str = "job") -> str:
        """The key for one input; ``self.error`` naming the field otherwise.

        ``{tenant_id}`` is the job's tenant (``.using(tenant_id=...)``) when it has one, else an
        input field of that name.
        """
        out: list[str] = []
        for literal, name in self._parts:
            out.append(literal)
            if name is None:
                continue
            value = tenant_id if name == TENANT_FIELD and tenant_id is not None else (
                values.get(name)
            )
            if value is None:
                hint = (" (pass .using(tenant_id=...), or a tenant_id input field)"
                        if name == TENANT_FIELD else "")
                raise self.error(
                    f"{job}: the {self.what} {self.template!r} needs {{{name}}}, which this "
                    f"enqueue does not give{hint}"
                )
            if isinstance(value, bool) or not isinstance(value, _FIELD_TYPES):
                raise self.error(
                    f"{job}: the {self.what} {self.template!r} needs {{{name}}} to be a string, "
                    "an integer, a datetime, date, time, UUID or Decimal, got "
                    f"{type(value).__name__} {safe_repr(value):.60}"
                )
            if value == "":
                raise self.error(f"{job}: the {self.what} {self.template!r} got an empty "
                                 f"{{{name}}}")
            out.append(str(value))
        return validate_key("".join(out), job=job, what=self.what, error=self.error)

    def check_parameters(self, func: Callable[..., Any], job: str) -> None:
        """Refuse a template field that is neither a parameter of ``func`` (after ``ctx``) nor
        ``{tenant_id}``: the key could never be built."""
        try:
            parameters = list(inspect.signature(func).parameters.values())[1:]
        except (TypeError, ValueError):  # a callable without a signature: nothing to check
            return
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
            return
        names = {p.name for p in parameters if p.kind in (
            inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}
        for name in self.fields:
            if name != TENANT_FIELD and name not in names:
                raise ConfigurationError(
                    f"{job}: the {self.what} {self.template!r} uses {{{name}}}, which is not a "
                    f"parameter of {func.__qualname__} (nor {{tenant_id}})"
                )


def validate_key(key: Any, *, job: str = "job", what: str,
                 error: type[InvalidJobInput]) -> str:
    """A key as stored: a non-empty string of at most 500 characters, valid UTF-8, no NUL."""
    if not isinstance(key, str) or not key or len(key) > MAX_SLOT_KEY or "\x00" in key:
        raise error(
            f"{job}: a {what} must be a non-empty string of at most {MAX_SLOT_KEY} characters "
            f"without NUL, got {key!r:.100}"
        )
    if not is_utf8(key):
        raise error(f"{job}: the {what} contains a lone surrogate, which is not valid UTF-8")
    return key
