"""A module of no installed app (``tests`` is a package, not an app): a task declared from here
must be refused (tests/integration/test_django_tasks_backend.py)."""


def early(x):
    return x
