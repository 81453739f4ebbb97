"""The worker: ``loop.Worker`` is the control flow; ``manage.py xjobs_worker`` runs it."""
