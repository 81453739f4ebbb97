"""The worker: ``loop.Worker`` is the control flow; ``manage.py xjobs_worker`` runs it, composed
with its background duties by django_xjobs/worker_process.py."""
