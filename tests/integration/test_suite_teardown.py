"""The suite's own teardown between committing tests (tests/conftest.py): it must leave no row a
test wrote, or later tests would see them, and keep the rows migrate wrote."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.contrib.contenttypes.models import ContentType
from django.test import TransactionTestCase

from django_xjobs.models import Job
from tests.testapp import jobs


@pytest.mark.django_db(transaction=True)
def test_the_teardown_empties_the_tables_a_test_wrote_and_keeps_what_migrate_wrote():
    permissions, types = Permission.objects.count(), ContentType.objects.count()
    assert permissions and types
    jobs.record.enqueue(tag="left behind")
    user = User.objects.create_user("teardown")
    user.user_permissions.add(Permission.objects.first())  # a row referencing auth_user

    case = TransactionTestCase()  # of the default database
    case._fixture_teardown()

    assert not Job.objects.exists()
    assert not User.objects.exists()
    assert not User.user_permissions.through.objects.exists()
    assert (Permission.objects.count(), ContentType.objects.count()) == (permissions, types)
