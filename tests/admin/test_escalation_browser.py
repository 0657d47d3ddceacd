"""An administrator sets a list's escalation in the console with a real browser (headless
Chromium): a bad step is refused with its message beside the field, a good one is saved."""

import json

import pytest
from django.urls import reverse

from notifications.models import NotificationList, SmsTarget
from tests.admin.conftest import make_user
from tests.admin.test_browser import browser, log_in  # noqa: F401 (the browser fixture)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def page(browser):  # noqa: F811
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.set_default_timeout(15_000)
    yield context.new_page()
    context.close()


def test_an_administrator_sets_escalation_steps_and_a_bad_step_is_explained(page, live_server):
    leads = NotificationList.objects.create(name="Shift-Leads")
    SmsTarget.objects.create(notification_list=leads, phone_number="+4930123456")
    operators = NotificationList.objects.create(name="Operators")
    log_in(page, live_server, make_user("adam", groups=["Administrators"]))
    page.goto(f"{live_server.url}{reverse('admin:notifications_notificationlist_change', args=[operators.pk])}")

    page.fill("textarea[name=escalation]", json.dumps([{"after_seconds": 300, "list": "Shift-Leads", "type": "teams"}]))
    page.click("input[name=_save]")
    error = page.locator(".field-escalation .errorlist")
    assert "the list 'Shift-Leads' has no targets for the channel 'teams' (it has: sms)" in error.inner_text()
    assert NotificationList.objects.get(pk=operators.pk).escalation == []

    steps = [{"after_seconds": 300, "list": "Shift-Leads", "type": "sms"}]
    page.fill("textarea[name=escalation]", json.dumps(steps))
    page.fill("input[name=repeat_last_every_seconds]", "600")
    page.select_option("select[name=ack_required_from]", "critical")
    page.click("input[name=_save]")
    page.wait_for_selector("ul.messagelist li.success")
    operators.refresh_from_db()
    assert (operators.escalation, operators.repeat_last_every_seconds, operators.ack_required_from) == (
        steps,
        600,
        "critical",
    )
