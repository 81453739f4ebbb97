from django.db import models


class Effect(models.Model):
    """A side effect of a test job, written in autocommit by the job itself, so the evidence of
    an execution survives whatever happens to the job's own acknowledgement."""

    job_id = models.TextField()
    name = models.TextField()
    attempt = models.IntegerField()
    pid = models.IntegerField()
    kind = models.TextField()  # start | end
    tag = models.TextField(default="")
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["job_id"])]


class Counted(models.Model):
    """A row the test backfills touch: ``hits`` counts how often a committed batch processed it,
    so "every row exactly once" is "every hits is 1". ``poison`` makes a batch that meets the
    row raise."""

    hits = models.IntegerField(default=0)
    poison = models.BooleanField(default=False)
