"""The published OpenAPI description of a notification (GET /api/v1/schema/) says what validation
enforces: the same fields, the same required ones, the same length limits, the same enums.
Each statement of the schema is tried against notification_validate, so a limit changed on
one side only fails here."""

import pytest

from notifications.ingest import ACCEPTED_FIELDS, notification_validate
from tests.support.payloads import make_payload

SITE = "plant-a"


@pytest.fixture
def schema(client, db):
    response = client.get("/api/v1/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    return response.json()


def resolve(schema, node):
    while "$ref" in node:
        name = node["$ref"].rpartition("/")[2]
        node = schema["components"]["schemas"][name]
    return node


@pytest.fixture
def notification_in(schema):
    body = schema["paths"]["/api/v1/notifications/"]["post"]["requestBody"]
    return resolve(schema, body["content"]["application/json"]["schema"])


def problems(payload):
    """The fields validation complains about ({} when valid)."""
    _, rejection = notification_validate(payload, site_id=SITE)
    return {} if rejection is None else rejection.errors


def enum_values(schema, node):
    """The enum a property allows, following $ref and oneOf (drf-spectacular's nullable enums)."""
    node = resolve(schema, node)
    values = list(node.get("enum", []))
    for option in node.get("oneOf", []):
        values += enum_values(schema, option)
    return values


def test_the_schema_names_exactly_the_fields_validation_accepts(notification_in):
    properties = notification_in["properties"]
    assert set(properties) == ACCEPTED_FIELDS
    assert problems(make_payload()) == {}
    for name in properties:
        assert problems({**make_payload(), name: make_payload().get(name)}).get(name) != ["Unknown field."]
    assert problems({**make_payload(), "not_in_the_schema": "x"}) == {"not_in_the_schema": ["Unknown field."]}


def test_the_schema_requires_exactly_the_fields_validation_requires(notification_in):
    required = set(notification_in["required"])
    for name in notification_in["properties"]:
        payload = make_payload()
        payload.pop(name, None)
        if name in required:
            assert problems(payload) == {name: ["This field is required."]}, name
        else:
            assert problems(payload) == {}, name


def test_nullable_fields_accept_null_and_the_others_refuse_it(notification_in):
    for name, spec in notification_in["properties"].items():
        errors = problems({**make_payload(), name: None})
        if spec.get("nullable"):
            assert errors == {}, name
        else:
            assert name in errors, name


def test_every_length_limit_of_the_schema_is_the_one_validation_enforces(notification_in):
    limited = {name: spec for name, spec in notification_in["properties"].items() if "maxLength" in spec}
    assert {"list_name", "subject", "body", "source_instance_id", "source_script", "source_site_id"} <= set(limited)
    for name, spec in limited.items():
        longest = spec["maxLength"]
        at_limit = problems({**make_payload(), name: "x" * longest})
        # At the limit, source_site_id still has to be the key's site; nothing else may object.
        assert name not in at_limit or at_limit[name] == ["Does not match the site of the API key."], name
        over = problems({**make_payload(), name: "x" * (longest + 1)})
        assert over.get(name) == [f"Must be at most {longest} characters (got {longest + 1})."], name


def test_every_string_without_a_stated_limit_has_a_format_validation_checks(notification_in):
    for name, spec in notification_in["properties"].items():
        if spec.get("type") == "string" and "maxLength" not in spec:
            assert spec.get("format") in {"uuid", "date-time"}, name
            assert name in problems({**make_payload(), name: "x" * 10}), name


def test_a_minimum_length_of_the_schema_is_enforced(notification_in):
    for name, spec in notification_in["properties"].items():
        if spec.get("minLength"):
            assert name in problems({**make_payload(), name: ""}), name


def test_the_type_enum_is_the_set_of_types_validation_accepts(schema, notification_in):
    allowed = enum_values(schema, notification_in["properties"]["type"])
    assert "email" in allowed
    for value in allowed:
        assert problems({**make_payload(), "type": value}) == {}, value
    assert "type" in problems({**make_payload(), "type": "pigeon"})


def test_the_documented_default_type_is_the_one_validation_applies(notification_in):
    default = notification_in["properties"]["type"]["default"]
    payload = make_payload()
    del payload["type"]
    item, _ = notification_validate(payload, site_id=SITE)
    assert item is not None and item.type == default
