"""Which code processed a pass: the function's checksum and the project's version.

A pass records both when it starts (``x_backfills.checksum``, ``app_version``), and a pass
resumed under different code logs it and records the change (``code_changes``), so an operator
can tell which rows which code processed (docs/backfills.md, "Running a backfill during a
deploy").
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable
from typing import Any

from django.conf import settings

from .. import conf

_versions: dict[tuple[str, ...], str] = {}


def checksum_of(func: Callable[..., Any]) -> str:
    """sha256 of the function's source: what "the same code" means for a resumed pass.

    Without source (a function built at run time), the code object's bytecode and constants
    stand in: they change when the code does, though also across Python versions.
    """
    try:
        text = inspect.getsource(func).encode("utf-8")
    except (OSError, TypeError):
        code = getattr(func, "__code__", None)
        text = repr((code.co_code, code.co_consts) if code is not None else func).encode()
    return hashlib.sha256(text).hexdigest()


def project_version(modules: tuple[str, ...]) -> str:
    """The version of the first installed distribution that provides one of ``modules``' top
    packages, else "". Looked up once per set of modules."""
    cached = _versions.get(modules)
    if cached is not None:
        return cached
    # Imported here: about 50 ms of start-up that only a backfill pass needs.
    from importlib import metadata

    found = ""
    provided = metadata.packages_distributions()
    for module in modules:
        for dist in provided.get(module.split(".")[0], ()):
            try:
                found = metadata.version(dist)
            except metadata.PackageNotFoundError:
                continue
            break
        if found:
            break
    _versions[modules] = found
    return found


def app_version(func: Callable[..., Any]) -> str:
    """``XJOBS["APP_VERSION"]``; by default the version of the project's installed package: the
    distribution providing the settings module's top package, else the one providing the
    backfill's function ``func``; else "" (a project that is not pip-installed has no version)."""
    configured = conf.get().app_version
    if configured is not None:
        return configured
    modules = tuple(m for m in (getattr(settings, "SETTINGS_MODULE", None),
                                func.__module__) if m)
    return project_version(modules)
