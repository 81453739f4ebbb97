"""What the upgrade test's jobs did, one row per execution of a job or of a step's body."""

from django.db import models


class Execution(models.Model):
    """One run of a job's code (``what = "run"``) or of a step's body (``"step:<name>"``).

    ``side`` is the version that ran it (``old`` or ``new``, from the worker's environment) and
    ``by`` the version whose producer enqueued the job: a job run twice for one attempt, or a
    step body run twice, shows as two rows with the same (job_id, attempt, what).
    """

    job_id = models.UUIDField()
    attempt = models.IntegerField()
    what = models.TextField()
    side = models.TextField()
    by = models.TextField()
    pid = models.IntegerField()
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "upgrade_executions"
        indexes = [models.Index(fields=["job_id"], name="upgrade_exec_job_idx")]
