"""Maintenance: retention deletes the leading scheduler runs on its own interval
(``maintenance.pruner``), also callable as ``manage.py xjobs maintenance``."""
