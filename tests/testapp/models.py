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
