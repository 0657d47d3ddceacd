"""What a site sends: a valid notification payload for the ingest API."""

import uuid
from typing import Any


def make_payload(**overrides: Any) -> dict[str, Any]:
    """A complete, valid single-notification payload with a fresh ``notification_id``;
    ``overrides`` replace or add fields."""
    payload: dict[str, Any] = {
        "notification_id": str(uuid.uuid4()),
        "type": "email",
        "list_name": "Operators",
        "subject": "Pump 3 tripped",
        "body": "Pump 3 tripped on overcurrent at 10:00.",
        "type_data": {},
        "source_instance_id": "Pump3",
        "source_script": "OnTrip",
        "site_enqueued_at": "2026-11-21T10:00:00Z",
    }
    payload.update(overrides)
    return payload
