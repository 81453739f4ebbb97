"""Functions declared as tasks before the app registry is ready (a settings module or an app's
``__init__`` importing them): tests/integration/test_django_tasks_backend.py. No models here,
so the module imports before ``django.setup()``."""


def early(x):
    return x
