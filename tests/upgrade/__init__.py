"""The upgrade test: a baseline of django-xjobs from this repository's history, migrated to the
working tree under load, with both versions' workers side by side (``run.py``)."""
