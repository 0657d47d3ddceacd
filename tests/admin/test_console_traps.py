"""The console's traps, each reproduced as the operator met it: the "list exists now" prompt
for rows the real dispatcher parked, the delivery policy page, write-only targets after a
validation error, pasted addresses, the CSV export, Japanese list names, partial deliveries,
the test-notification form."""

import pytest
from django.contrib.messages import get_messages
from django.urls import reverse
from django.utils import timezone

from notifications.models import Notification, NotificationList
from tests.admin.conftest import make_user
from tests.dispatch.conftest import configure_smtp, fresh, queue, run_pass
from tests.support.smtp import SmtpServer

Status = Notification.Status
OUTBOX = reverse("admin:notifications_notification_changelist")
PARKED = reverse("admin:notifications_notification_parked")
PARKED_RETRY = reverse("admin:notifications_notification_parked_retry")


@pytest.fixture
def smtp_server():
    with SmtpServer() as server:
        yield server


@pytest.fixture
def smtp_config(db, smtp_server):
    return configure_smtp(smtp_server)


def texts(response):
    return [str(m) for m in get_messages(response.wsgi_request)]


def test_rows_the_dispatcher_parked_for_an_unknown_list_are_offered_for_retry_once_it_exists(client, smtp_config):
    # The dispatcher's own words ("Permanent failure (configuration): Unknown notification
    # list …"), not a fixture's: the prompt is keyed on the row's failure code.
    rows = queue(2, list_name="Night-Shift")
    run_pass()
    parked = [fresh(row) for row in rows]
    assert {row.status for row in parked} == {Status.PARKED}
    assert {row.failure_code for row in parked} == {"unknown_list"}
    client.force_login(make_user("olivia", groups=["Operators"]))
    assert 'id="outbox-lists-ready"' not in client.get(OUTBOX).content.decode()

    NotificationList.objects.create(name="Night-Shift")
    content = client.get(OUTBOX).content.decode()
    assert "2 parked notifications failed because the list “Night-Shift” did not exist; it exists now." in content
    assert "Retry 2</button>" in content
    assert "exists now" in client.get(PARKED).content.decode()
    response = client.post(PARKED_RETRY, {"cause": parked[0].last_error})
    assert "Retried 2 notifications." in texts(response)
    assert {fresh(row).status for row in rows} == {Status.PENDING}


def test_a_delivered_row_loses_its_failure_code(smtp_server, smtp_config, operators_list):
    (row,) = queue(list_name="Late-List")
    run_pass()
    assert fresh(row).failure_code == "unknown_list"
    NotificationList.objects.filter(pk=operators_list.pk).update(name="Late-List")
    Notification.objects.filter(pk=row.pk).update(status=Status.PENDING, next_attempt_at=None)
    run_pass()
    row = fresh(row)
    assert row.status == Status.DELIVERED and row.failure_code == ""


# --- delivery policies: the policy in force, and a new one starts from it ---------------------

POLICY_ADD = reverse("admin:notifications_deliverypolicy_add")
POLICIES = reverse("admin:notifications_deliverypolicy_changelist")


def form_data_from_initial(form):
    data = {}
    for name, field in form.fields.items():
        value = form.initial.get(name, field.initial)
        if value is None or value is False:
            continue
        data[name] = [str(item) for item in value] if isinstance(value, list | tuple) else str(value)
    return data


def test_a_new_policy_starts_from_the_policy_in_force_and_keeps_retrying_outages(client, db):
    from notifications.policies import delivery_failure_decide, delivery_policy_default, delivery_policy_for

    client.force_login(make_user("adam", groups=["Administrators"]))
    listing = client.get(POLICIES).content.decode()
    assert "Policy in force per channel" in listing and 'data-channel="webhook"' in listing
    response = client.get(POLICY_ADD, {"channel": "webhook"})
    default = delivery_policy_default(channel="webhook")
    data = form_data_from_initial(response.context["adminform"].form)
    assert data["channel"] == "webhook"
    assert set(data["retry_on"]) == set(default.retry_on) and "connection" in data["retry_on"]
    assert int(data["max_attempts"]) == default.timing.max_attempts
    # The operator changes only the number of attempts, as in the field report.
    data["max_attempts"] = "3"
    response = client.post(POLICY_ADD, data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    stored = delivery_policy_for(channel="webhook")
    assert stored.stored and stored.timing.max_attempts == 3 and stored.retry_on == default.retry_on
    decision = delivery_failure_decide(
        policy=stored,
        failure_class="connection",
        message="connection refused",
        row_failures=0,
        queued_at=timezone.now(),
        now=timezone.now(),
        rand=0.5,
    )
    assert decision.status == Status.RETRYING


def test_unticking_a_channel_failure_class_needs_a_confirmation(client, db):
    client.force_login(make_user("adam", groups=["Administrators"]))
    data = form_data_from_initial(client.get(POLICY_ADD, {"channel": "teams"}).context["adminform"].form)
    data["retry_on"] = [value for value in data["retry_on"] if value not in ("connection", "timeout")]
    response = client.post(POLICY_ADD, data)
    assert response.status_code == 200
    assert "Not retried: connection, timeout." in str(response.context["adminform"].form.errors)
    data["park_channel_failures"] = "on"
    assert client.post(POLICY_ADD, data).status_code == 302


# --- write-only fields after a validation error elsewhere -------------------------------------


def test_a_typed_teams_url_survives_a_validation_error_elsewhere_in_the_list_form(client, db):
    from tests.channels.test_console_and_config import TEAMS_URL, list_form

    client.force_login(make_user("adam", groups=["Administrators"]))
    add = reverse("admin:notifications_notificationlist_add")
    data = list_form(
        teams_targets=[{"url": TEAMS_URL}],
        email_recipients=[{"email": "not an address"}],
    )
    response = client.post(add, data)
    assert response.status_code == 200
    teams_field = response.context["inline_admin_formsets"][1].formset.forms[0]["url"]
    # What the administrator typed comes back (masked in a password field), so the next save keeps it.
    assert f'value="{TEAMS_URL.replace("&", "&amp;")}"' in str(teams_field)
    data["email_recipients-0-email"] = "night.lead@example.com"
    assert client.post(add, data).status_code == 302
    assert NotificationList.objects.get(name="Channels").teams_targets.get().url == TEAMS_URL


def test_a_stored_teams_url_is_never_rendered(client, db):
    from tests.channels.test_console_and_config import TEAMS_URL

    client.force_login(make_user("adam", groups=["Administrators"]))
    channels = NotificationList.objects.create(name="Channels")
    channels.teams_targets.create(url=TEAMS_URL)
    page = client.get(reverse("admin:notifications_notificationlist_change", args=[channels.pk])).content.decode()
    assert "S3CR3T" not in page


# --- addresses pasted from a mail program --------------------------------------------------------


def test_addresses_pasted_from_outlook_are_accepted_by_name_and_address(client, db):
    from tests.channels.test_console_and_config import list_form

    client.force_login(make_user("adam", groups=["Administrators"]))
    data = list_form(email_recipients=[{"email": "Robert Ito <r.ito@example.com>"}])
    data["add_addresses"] = (
        "Ito, Robert <r.ito@example.com>; Dubois, Pierre <p.dubois@example.com>\n"
        '"Müller, Anna" <a.mueller@example.com>, plain@example.com\n'
    )
    response = client.post(reverse("admin:notifications_notificationlist_add"), data)
    assert response.status_code == 302, response.context and response.context["adminform"].form.errors
    stored = set(NotificationList.objects.get(name="Channels").email_recipients.values_list("email", flat=True))
    assert stored == {"r.ito@example.com", "p.dubois@example.com", "a.mueller@example.com", "plain@example.com"}


def test_a_pasted_line_with_something_else_names_it():
    from notifications.list_tools import addresses_parse

    addresses, problems = addresses_parse("Robert Ito <r.ito@example.com>, Night shift\n")
    assert addresses == ["r.ito@example.com"]
    assert problems == ["Line 1: “Night” is not an email address (in “Robert Ito <r.ito@example.com>, Night shift”)."]


# --- the CSV export -------------------------------------------------------------------------------


def test_the_csv_export_opens_in_excel_with_discarded_at_and_each_recipients_outcome(client, db):
    import csv
    import io
    from datetime import timedelta

    from tests.admin.conftest import make_notification

    client.force_login(make_user("olivia", groups=["Operators"]))
    discarded = make_notification(
        status=Status.DISCARDED, subject="ポンプ停止", discarded_at=timezone.now(), discarded_by="olivia"
    )
    partial = make_notification(
        status=Status.DELIVERED,
        age=timedelta(minutes=1),
        resolved_targets=[
            {"target": "a@example.com", "outcome": "delivered"},
            {"target": "b@example.com", "outcome": "refused", "smtp_code": 552},
            {"target": "c@example.com", "outcome": "delivered"},
        ],
        targets_refused=1,
    )
    response = client.get(reverse("admin:notifications_notification_export"))
    raw = b"".join(response.streaming_content)
    assert raw.startswith(b"\xef\xbb\xbf")  # the byte-order mark Excel needs to read UTF-8
    rows = list(csv.DictReader(io.StringIO(raw.decode("utf-8-sig"))))
    by_id = {row["notification_id"]: row for row in rows}
    assert by_id[str(discarded.pk)]["subject"] == "ポンプ停止"
    assert by_id[str(discarded.pk)]["discarded_at"].startswith(str(discarded.discarded_at.year))
    assert by_id[str(partial.pk)]["recipients"] == "delivered to 2 of 3, 1 refused (552)"
    assert by_id[str(discarded.pk)]["recipients"] == ""


# --- Japanese list names ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["ポンプ監視班", "ひらがなの班", "ﾎﾟﾝﾌﾟ監視", "ポンプ監視班 B-2", "서울 監視", "监视ㄅ"])
def test_a_name_in_one_writing_system_is_accepted(client, db, name):
    from tests.channels.test_console_and_config import list_form

    client.force_login(make_user("adam", groups=["Administrators"]))
    response = client.post(reverse("admin:notifications_notificationlist_add"), list_form(name=name))
    assert response.status_code == 302, response.context and response.context["adminform"].form.errors
    assert NotificationList.objects.filter(name=name).exists()


@pytest.mark.parametrize(("name", "mixed"), [("Оperators", "Cyrillic and Latin"), ("Ελληνικά監視", "Greek and Han")])
def test_look_alike_mixtures_are_still_refused(name, mixed):
    from notifications.list_names import list_name_problem

    assert list_name_problem(name) == f"Mixes {mixed} letters; a name that looks like another one is refused."


# --- the test-notification form, "Retry all" ------------------------------------------------------


def test_the_test_notification_form_offers_only_channels_the_list_has_targets_on(client, db):
    from tests.channels.test_console_and_config import TEAMS_URL

    client.force_login(make_user("adam", groups=["Administrators"]))
    teams_only = NotificationList.objects.create(name="Teams-Only")
    teams_only.teams_targets.create(url=TEAMS_URL)
    url = reverse("admin:notifications_notificationlist_send_test", args=[teams_only.pk])
    form = client.get(url).context["form"]
    assert [value for value, _ in form.fields["channel"].choices] == ["teams"]
    response = client.post(url, {"channel": "email", "subject": "x", "body": "y"})
    assert response.status_code == 200 and "channel" in response.context["form"].errors
    assert not Notification.objects.exists()
    empty = NotificationList.objects.create(name="Empty")
    page = client.get(reverse("admin:notifications_notificationlist_send_test", args=[empty.pk])).content.decode()
    assert 'id="list-send-test-none"' in page and 'id="list-send-test-form"' not in page


def test_retry_all_of_a_parked_group_asks_first(client, db):
    from tests.admin.conftest import make_notification

    client.force_login(make_user("olivia", groups=["Operators"]))
    rows = [make_notification(status=Status.PARKED) for _ in range(3)]
    cause = rows[0].last_error
    assert 'name="confirm" value="ask"' in client.get(PARKED).content.decode()
    confirm = client.post(PARKED_RETRY, {"cause": cause, "confirm": "ask"})
    assert confirm.status_code == 200 and "Retry 3 parked notifications" in confirm.content.decode()
    assert {fresh(row).status for row in rows} == {Status.PARKED}
    done = client.post(PARKED_RETRY, {"cause": cause})
    assert done.status_code == 302 and {fresh(row).status for row in rows} == {Status.PENDING}


# --- sites for operators ----------------------------------------------------------------------------


def test_operators_read_site_pages_but_cannot_change_them_or_see_keys(client, db):
    from sites.models import Site

    site = Site.objects.create(site_id="plant-z", name="Plant Z", last_seen_at=timezone.now())
    site.api_keys.model.objects.create_key(site=site, name="main")
    client.force_login(make_user("olivia", groups=["Operators"]))
    listing = client.get(reverse("admin:sites_site_changelist"))
    assert listing.status_code == 200 and "plant-z" in listing.content.decode()
    page = client.get(reverse("admin:sites_site_change", args=[site.pk]))
    assert page.status_code == 200
    content = page.content.decode()
    assert "direct</span> last post" in content and 'name="_save"' not in content
    assert "Issue" not in content and "revoke" not in content.lower()
    assert client.post(reverse("admin:sites_site_change", args=[site.pk]), {"name": "X"}).status_code == 403
