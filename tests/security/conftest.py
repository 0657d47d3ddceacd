"""Fixtures for the security tests: a console administrator."""

import pytest

from tests.admin.conftest import login, make_user


@pytest.fixture
def admin_client_(client, db):
    """A client logged in as a member of the Administrators group."""
    return login(client, make_user("adam", groups=["Administrators"]))
