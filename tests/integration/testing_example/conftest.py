import pytest


@pytest.fixture
def inline_jobs(settings):
    """Run each job when the transaction that enqueued it commits (docs/testing.md)."""
    settings.XJOBS = {**getattr(settings, "XJOBS", {}), "TEST_MODE": "inline"}
