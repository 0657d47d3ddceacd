"""schemathesis against the site endpoints (heartbeat, parked report, command acknowledgement),
with the same checks as the notification endpoints: no 5xx, documented codes and bodies,
invalid input rejected."""

from hypothesis import HealthCheck, settings

from tests.fuzz.test_schema_fuzz import CHECKS, EXAMPLES, fuzz_key, schema

__all__ = ["fuzz_key"]  # the fixture, shared with the notification endpoints' fuzzing


@schema.include(path_regex="^/api/v1/sites/").parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.filter_too_much],
)
def test_the_site_endpoints_conform_to_their_schema_and_never_answer_5xx(case, fuzz_key):
    case.call_and_validate(headers={"Authorization": f"Api-Key {fuzz_key}"}, checks=CHECKS)
