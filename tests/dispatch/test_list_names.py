"""List names at delivery time: one case-folding rule (Python's), whatever the database's
locale says about ``lower()``, for every script."""

import pytest

from notifications.models import EmailRecipient, NotificationList
from tests.dispatch.conftest import fresh, queue, run_pass


@pytest.mark.parametrize(
    "configured, sent",
    [
        ("ΟΔΟΣ", "οδος"),
        ("İzmir", "İzmir"),
        ("İzmir", "İZMİR"),
        ("İzmir", "IZMIR"),
        ("Straße", "STRASSE"),
        ("Opérateurs", "OPÉRATEURS"),
        ("Ops", " ops "),
    ],
)
def test_a_list_is_found_by_any_casing_of_its_name_in_any_script(smtp_server, smtp_config, configured, sent):
    notification_list = NotificationList.objects.create(name=configured)
    EmailRecipient.objects.create(notification_list=notification_list, email="op@example.com")
    (row,) = queue(list_name=sent)
    run_pass()
    assert fresh(row).status == "Delivered"
    assert smtp_server.received[0].rcpt_tos == ["op@example.com"]
