"""The demo's last part: the operations console, ready to open in a browser."""

from __future__ import annotations

from django.contrib.auth import get_user_model

USERNAME, PASSWORD = "admin", "admin"


def show_console(stdout) -> None:
    """Make sure the demo's superuser exists (idempotent) and tell how to open the console."""
    User = get_user_model()
    user, created = User.objects.get_or_create(
        username=USERNAME, defaults={"email": "admin@example.com", "is_staff": True,
                                     "is_superuser": True})
    if created:
        user.set_password(PASSWORD)
        user.save(update_fields=["password"])
    login = f"login: {USERNAME} / {PASSWORD}" if created or user.check_password(PASSWORD) else (
        f"login: {USERNAME} (its password was changed since the demo created it)")
    stdout.write("\nthe operations console")
    stdout.write("  start the web server:  cd example_project && ../.venv/bin/python manage.py "
                 "runserver")
    stdout.write("  then open the console: http://127.0.0.1:8000/_x/  (the dashboard, with charts)")
    stdout.write("  in the project admin:  http://127.0.0.1:8000/admin/django_xjobs/")
    stdout.write(f"  {login}  (superuser, created by the demo if missing)")
    stdout.write("  from a terminal:       ../.venv/bin/python manage.py xjobs dashboard "
                 "(or health, jobs, why ID; --json for scripts)")
