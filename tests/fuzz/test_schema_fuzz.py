"""schemathesis against the OpenAPI schema, in process (WSGI), with the site-key auth
registered so that cases without or with broken credentials are tried too.

Asserts no 5xx, documented status codes, content types and response bodies, and that
invalid input is rejected. Examples are bounded (OUTBOX_FUZZ_EXAMPLES, default 30).
"""

import os

import pytest
import schemathesis
from django.core import signals
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from schemathesis import checks

from outbox_project.wsgi import application
from sites.models import Site
from sites.services import site_key_issue

schema = schemathesis.openapi.from_wsgi("/api/v1/schema/", application)
# The site key is sent by the test itself (below), so a generated case that "lacks" the
# Authorization header is not negative data at all; ignored_auth still tries cases without,
# and with a broken, key.
schema.config.generation.update(with_security_parameters=False)
# Invalid data may also be refused as too large before it is parsed (a body over
# OUTBOX_MAX_BODY_BYTES): 413 is a rejection too.
_rejection = schema.config.checks.negative_data_rejection
schema.config.checks.negative_data_rejection = type(_rejection)(
    expected_statuses=[*_rejection.expected_statuses, "413"]
)
EXAMPLES = int(os.environ.get("OUTBOX_FUZZ_EXAMPLES", "30"))


@pytest.fixture
def fuzz_key(db):
    # The WSGI handler closes the connection after each request; inside a test that would
    # close the test transaction. Django's test client disconnects the same handler.
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    site = Site.objects.create(site_id="fuzz-site", name="Fuzz")
    yield site_key_issue(site=site)[1]
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
    checks.negative_data_rejection,
    checks.ignored_auth,
]


@schema.include(path_regex="^/api/v1/notifications").parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.filter_too_much],
)
def test_api_conforms_to_its_schema_and_never_answers_5xx(case, fuzz_key):
    # ignored_auth re-sends each case without, and with a broken, Authorization header.
    case.call_and_validate(headers={"Authorization": f"Api-Key {fuzz_key}"}, checks=CHECKS)
