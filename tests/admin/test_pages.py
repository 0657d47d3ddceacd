"""What the console pages show: the outbox list and its cost, the read-only detail page, and
the administration of lists, SMTP and sites."""

import re
import socket
from datetime import timedelta
from typing import cast

import pytest
from aiosmtpd.controller import Controller
from django.contrib.messages import get_messages
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from notifications.admin import outbox as outbox_admin
from notifications.models import DeliveryAttempt, EmailRecipient, Notification, NotificationList, SmtpConfiguration
from sites.models import SiteAPIKey
from tests.admin.conftest import make_notification

Status = Notification.Status
OUTBOX = reverse("admin:notifications_notification_changelist")


def texts(response):
    return [str(m) for m in get_messages(response.wsgi_request)]


# --- Outbox page -----------------------------------------------------------------------------


def test_outbox_rows_show_short_id_status_and_stuck_badges_and_error_excerpt(operator_client):
    stuck = make_notification(status=Status.RETRYING, age=timedelta(hours=1), last_error="421 " + "busy " * 50)
    fresh = make_notification(status=Status.PENDING)
    content = operator_client.get(OUTBOX).content.decode()
    assert str(stuck.pk)[:8] in content and str(fresh.pk)[:8] in content
    assert 'outbox-status-retrying">Retrying<' in content
    assert content.count('class="outbox-badge outbox-stuck"') == 1
    assert "421 busy busy" in content and "…" in content
    # The attempts made are in the error cell ("… (3 attempts)"): the subject gets the width.
    for column in ("List", "Subject", "Site", "Created", "Last error"):
        assert column in content
    # Timestamps carry seconds and the zone.
    assert re.search(r"<time [^>]*>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC</time>", content)


def test_outbox_page_runs_the_same_few_queries_for_5_or_60_rows(operator_client):
    def queries_for_page():
        with CaptureQueriesContext(connection) as captured:
            assert operator_client.get(OUTBOX).status_code == 200
        return captured

    for _ in range(5):
        make_notification(status=Status.PARKED)
    few = len(queries_for_page())
    for _ in range(55):
        make_notification(status=Status.DELIVERED, last_error="")
    captured = queries_for_page()
    assert len(captured) == few
    counts = [q["sql"] for q in captured if "COUNT(*)" in q["sql"].upper()]
    # Counting is always bounded, never a full-table COUNT(*): a LIMIT inside the count,
    # (the KPIs' failures by class on PostgreSQL) the attempts of less than an hour, or (the
    # KPIs' deliveries queued) the waiting rows alone, which their claim index holds.
    edge = re.compile(r"started_at >= [^\n]+ AND started_at < ", re.IGNORECASE)
    waiting = re.compile(r"WHERE \S+\.\S*status\S* IN \('Pending', 'Retrying'\) GROUP BY", re.IGNORECASE)
    assert counts and all("LIMIT" in sql.upper() or edge.search(sql) or waiting.search(sql) for sql in counts)


def test_the_paginator_counts_exactly_below_its_limit_and_estimates_above_it(operator_client, monkeypatch):
    from notifications import db

    monkeypatch.setattr(outbox_admin.OutboxPaginator, "exact_limit", 5)
    # A table this small is read whole for any page, which counts it in the same pass: here
    # the page is read as a large table's is, in order.
    monkeypatch.setattr(db, "plan_reads_every_match", lambda queryset: False)
    for _ in range(8):
        make_notification()
    cl = operator_client.get(OUTBOX).context["cl"]
    if connection.vendor == "postgresql":
        assert cl.paginator.is_estimate and cl.result_count >= 6
    else:
        assert cl.result_count == 8
    assert operator_client.get(OUTBOX, {"status": "Parked"}).context["cl"].result_count == 0


def test_a_count_that_takes_too_long_is_cancelled_and_the_page_shows_an_estimate(operator_client, monkeypatch):
    from notifications import db

    make_notification()
    if connection.vendor != "postgresql":
        assert db.count_within(Notification.objects.all(), 0) == 1  # no statement timeout: it counts
        return
    slow = Notification.objects.extra(where=["pg_sleep(0.3) IS NOT NULL"])
    with connection.cursor() as cursor:
        cursor.execute("SHOW statement_timeout")
        before = cursor.fetchone()[0]
    assert db.count_within(slow, 50) is None
    assert db.count_within(Notification.objects.all(), 50) == 1
    with connection.cursor() as cursor:  # the connection is usable and its timeout as it was
        cursor.execute("SHOW statement_timeout")
        assert cursor.fetchone()[0] == before
    monkeypatch.setattr(db, "count_within", lambda queryset, milliseconds: None)
    monkeypatch.setattr(db, "plan_reads_every_match", lambda queryset: False)  # as for a large table
    cl = operator_client.get(OUTBOX).context["cl"]
    assert cl.paginator.is_estimate and len(cl.result_list) == 1  # the rows shown are exact


def test_outbox_page_columns_cannot_sort_by_unindexed_fields(operator_client):
    make_notification()
    content = operator_client.get(OUTBOX).content.decode()
    assert re.search(r'<th scope="col" class="sortable[^"]*column-created_column', content)
    assert '<th scope="col" class="column-subject_column">' in content


# --- Detail page -----------------------------------------------------------------------------


@pytest.fixture
def delivered(db):
    notification = make_notification(
        status=Status.DELIVERED,
        subject="Pump 3 tripped",
        source_instance_id="Pump3",
        source_script="OnTrip",
        resolved_targets=[
            {"target": "op1@example.com", "outcome": "delivered", "smtp_code": 250},
            {"target": "op2@example.com", "outcome": "refused", "smtp_code": 550, "error": "mailbox unknown"},
        ],
        type_data={"priority": "high"},
    )
    DeliveryAttempt.objects.create(
        notification=notification, duration_ms=42, outcome="success", detail={"smtp_code": 250}, worker="w1"
    )
    return notification


def test_detail_page_is_read_only_and_shows_targets_attempts_and_provenance(operator_client, delivered, site):
    content = operator_client.get(
        reverse("admin:notifications_notification_change", args=[delivered.pk])
    ).content.decode()
    assert "<input" not in re.sub(
        r'<input type="hidden"[^>]*>', "", content.split('id="notification_form"')[1].split("</form>")[0]
    )
    assert '<table class="outbox-targets">' in content
    assert "op2@example.com" in content and "mailbox unknown" in content and "<td>550</td>" in content
    assert "Delivery attempts" in content and "42" in content and "w1" in content
    assert "Provenance" in content and "Pump3" in content and "OnTrip" in content
    assert reverse("admin:sites_site_change", args=[site.pk]) in content
    assert "&quot;priority&quot;: &quot;high&quot;" in content


def test_detail_page_of_a_notification_from_a_removed_site_says_so(operator_client):
    notification = make_notification(source_site_id="plant-gone")
    content = operator_client.get(reverse("admin:notifications_notification_change", args=[notification.pk])).content
    assert b"plant-gone (no longer registered)" in content


# --- Dashboard and tiles ---------------------------------------------------------------------


def test_dashboard_shows_headline_tiles_linking_to_the_filtered_outbox(operator_client):
    make_notification(status=Status.PARKED)
    make_notification(status=Status.PENDING, age=timedelta(hours=1))
    content = operator_client.get(reverse("admin:index")).content.decode()
    assert f'id="kpi-queue-depth" href="{OUTBOX}?status=queued"' in content
    assert f'id="kpi-stuck" href="{OUTBOX}?stuck=1"' in content
    assert f'id="kpi-parked" href="{OUTBOX}?status=Parked"' in content
    assert re.search(r'id="kpi-parked"[^>]*><span class="outbox-tile-value">1<', content)
    assert re.search(r'id="kpi-stuck"[^>]*><span class="outbox-tile-value">1<', content)


def test_dashboard_shows_the_suppressed_and_held_for_digest_figure_linking_to_the_suppressed_rows(operator_client):
    make_notification(status=Status.SUPPRESSED, suppressed_by="silence:1")
    make_notification(status=Status.SUPPRESSED, suppressed_by="duplicate:x", age=timedelta(days=30))  # long ago
    make_notification(status=Status.PENDING, held_for_digest=timezone.now() + timedelta(minutes=1))
    content = operator_client.get(reverse("admin:index")).content.decode()
    assert f'id="kpi-suppressed" href="{OUTBOX}?status=Suppressed"' in content
    assert re.search(r'id="kpi-suppressed"[^>]*><span class="outbox-tile-value">1<', content)
    assert '<span id="kpi-held">1 held for digest</span>' in content
    Notification.objects.filter(held_for_digest__isnull=False).update(held_for_digest=None)
    assert 'id="kpi-held"' not in operator_client.get(reverse("admin:index")).content.decode()


def test_dashboard_hides_tiles_from_staff_who_cannot_view_notifications(client, db):
    from tests.admin.conftest import make_user

    client.force_login(make_user("sam"))
    assert b"kpi-queue-depth" not in client.get(reverse("admin:index")).content


def test_outbox_page_shows_all_tiles_and_the_per_site_breakdown(operator_client):
    make_notification(status=Status.PARKED, source_site_id="plant-b")
    make_notification(status=Status.DELIVERED, source_site_id="plant-a")
    content = operator_client.get(OUTBOX).content.decode()
    for tile in ("kpi-queue-depth", "kpi-stuck", "kpi-parked", "kpi-delivered", "kpi-oldest"):
        assert f'id="{tile}"' in content
    assert f'href="{OUTBOX}?site=plant-b&amp;status=Parked"' in content


# --- Notification lists ----------------------------------------------------------------------


def list_form(name, *emails, prefix="email_recipients"):
    data = {
        "name": name,
        "description": "",
        "recipient_mode": "bcc",
        f"{prefix}-TOTAL_FORMS": str(len(emails)),
        f"{prefix}-INITIAL_FORMS": "0",
    }
    data.update({f"{prefix}-{i}-email": email for i, email in enumerate(emails)})
    for channel_prefix in ("teams_targets", "webhook_targets", "sms_targets", "apprise_targets"):
        data.update({f"{channel_prefix}-TOTAL_FORMS": "0", f"{channel_prefix}-INITIAL_FORMS": "0"})
    return data


def test_duplicate_recipients_in_one_list_are_rejected_ignoring_case(admin_client_):
    response = admin_client_.post(
        reverse("admin:notifications_notificationlist_add"), list_form("Leads", "a@example.com", "A@Example.com")
    )
    assert response.status_code == 200
    assert b"already in this list" in response.content
    assert not NotificationList.objects.filter(name="Leads").exists()


def test_a_recipient_already_stored_cannot_be_added_again_in_another_case(admin_client_, operators_list):
    url = reverse("admin:notifications_notificationlist_change", args=[operators_list.pk])
    existing = list(operators_list.email_recipients.all())
    data = {
        "name": "Operators",
        "description": "",
        "recipient_mode": "bcc",
        "email_recipients-TOTAL_FORMS": "3",
        "email_recipients-INITIAL_FORMS": "2",
        "email_recipients-2-email": "OP1@example.com",
    }
    for i, recipient in enumerate(existing):
        data.update(
            {
                f"email_recipients-{i}-id": recipient.pk,
                f"email_recipients-{i}-email": recipient.email,
                f"email_recipients-{i}-notification_list": operators_list.pk,
            }
        )
    response = admin_client_.post(url, data)
    assert response.status_code == 200
    assert EmailRecipient.objects.filter(notification_list=operators_list).count() == 2


def test_invalid_recipient_addresses_are_rejected(admin_client_):
    response = admin_client_.post(
        reverse("admin:notifications_notificationlist_add"), list_form("Leads", "not-an-address")
    )
    assert response.status_code == 200
    assert b"Enter a valid email address" in response.content


def test_list_names_are_unique_ignoring_case(admin_client_, operators_list):
    response = admin_client_.post(reverse("admin:notifications_notificationlist_add"), list_form("OPERATORS"))
    assert response.status_code == 200
    assert b"already exists (list names ignore case)" in response.content
    assert NotificationList.objects.count() == 1


# --- SMTP configuration ----------------------------------------------------------------------


def smtp_form(**overrides):
    data = {
        "host": "smtp.example.com",
        "port": "587",
        "security": "starttls",
        "timeout_seconds": "10",
        "greeting_timeout_seconds": "30",
        "data_timeout_seconds": "600",
        "username": "outbox",
        "password": "",
        "from_address": "outbox@example.com",
        "max_retries": "10",
        "retry_interval_seconds": "60",
    }
    data.update(overrides)
    return data


@pytest.fixture
def smtp_config(db):
    return SmtpConfiguration.objects.create(
        host="smtp.example.com", username="outbox", password="s3cret-pw", from_address="outbox@example.com"
    )


def test_smtp_password_is_never_shown_and_blank_keeps_it(admin_client_, smtp_config):
    url = reverse("admin:notifications_smtpconfiguration_change", args=[smtp_config.pk])
    page = admin_client_.get(url)
    assert b"s3cret-pw" not in page.content
    assert b"A password is stored." in page.content
    assert admin_client_.post(url, smtp_form(timeout_seconds="30")).status_code == 302
    smtp_config.refresh_from_db()
    assert (smtp_config.timeout_seconds, smtp_config.password) == (30, "s3cret-pw")


def test_the_wait_after_the_message_is_set_apart_from_the_other_timeouts(admin_client_, smtp_config):
    url = reverse("admin:notifications_smtpconfiguration_change", args=[smtp_config.pk])
    assert smtp_config.data_timeout_seconds == 600  # RFC 5321's ten minutes by default
    assert 'name="data_timeout_seconds"' in admin_client_.get(url).content.decode()
    refused = admin_client_.post(url, smtp_form(data_timeout_seconds="0"))
    assert refused.status_code == 200
    assert "data_timeout_seconds" in refused.context["adminform"].form.errors
    assert admin_client_.post(url, smtp_form(data_timeout_seconds="900")).status_code == 302
    smtp_config.refresh_from_db()
    assert (smtp_config.timeout_seconds, smtp_config.data_timeout_seconds) == (10, 900)


@pytest.mark.parametrize(
    "change", [{"host": "attacker.example"}, {"port": "2525"}, {"security": "none"}], ids=["host", "port", "security"]
)
def test_moving_the_smtp_server_without_re_entering_the_password_is_refused(admin_client_, smtp_config, change):
    url = reverse("admin:notifications_smtpconfiguration_change", args=[smtp_config.pk])
    response = admin_client_.post(url, smtp_form(**change))
    assert response.status_code == 200
    assert "Re-enter the password (or remove it)" in response.content.decode()
    smtp_config.refresh_from_db()
    assert (smtp_config.host, smtp_config.port, smtp_config.security) == ("smtp.example.com", 587, "starttls")


def test_moving_the_smtp_server_with_the_password_re_entered_or_removed_is_saved(admin_client_, smtp_config):
    url = reverse("admin:notifications_smtpconfiguration_change", args=[smtp_config.pk])
    assert admin_client_.post(url, smtp_form(host="mail2.example.com", password="s3cret-pw")).status_code == 302
    assert admin_client_.post(url, smtp_form(host="mail3.example.com", clear_password="on")).status_code == 302
    smtp_config.refresh_from_db()
    assert (smtp_config.host, smtp_config.password) == ("mail3.example.com", "")


def test_smtp_password_can_be_replaced_or_removed(admin_client_, smtp_config):
    url = reverse("admin:notifications_smtpconfiguration_change", args=[smtp_config.pk])
    admin_client_.post(url, smtp_form(password="n3w"))
    smtp_config.refresh_from_db()
    assert smtp_config.password == "n3w"
    admin_client_.post(url, smtp_form(clear_password="on"))
    smtp_config.refresh_from_db()
    assert smtp_config.password == ""


def test_smtp_changelist_goes_straight_to_the_single_configuration(admin_client_, smtp_config):
    response = admin_client_.get(reverse("admin:notifications_smtpconfiguration_changelist"))
    assert response["Location"] == reverse("admin:notifications_smtpconfiguration_change", args=[smtp_config.pk])
    assert admin_client_.get(reverse("admin:notifications_smtpconfiguration_add")).status_code == 403


class Inbox:
    def __init__(self, reply="250 Message accepted for delivery"):
        self.reply, self.messages = reply, []

    async def handle_DATA(self, server, session, envelope):
        self.messages.append(envelope)
        return self.reply


@pytest.fixture
def smtp_server():
    inbox = Inbox()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    yield controller, inbox
    controller.stop()


def test_send_test_email_reports_the_servers_answer(admin_client_, smtp_server):
    controller, inbox = smtp_server
    config = SmtpConfiguration.objects.create(
        host="127.0.0.1", port=controller.port, security="none", from_address="outbox@example.com"
    )
    url = reverse("admin:notifications_smtpconfiguration_send_test", args=[config.pk])
    assert b"adam@example.com" in admin_client_.get(url).content
    response = admin_client_.post(url, {"to": "ops@example.com"})
    assert b"250 Message accepted for delivery" in response.content
    assert any("accepted the test message: 250 Message accepted" in text for text in texts(response))
    assert inbox.messages[0].rcpt_tos == ["ops@example.com"]


def test_send_test_email_reports_a_refusal(admin_client_, smtp_server):
    controller, inbox = smtp_server
    inbox.reply = "554 Transaction failed: spam"
    config = SmtpConfiguration.objects.create(
        host="127.0.0.1", port=controller.port, security="none", from_address="outbox@example.com"
    )
    response = admin_client_.post(
        reverse("admin:notifications_smtpconfiguration_send_test", args=[config.pk]), {"to": "ops@example.com"}
    )
    assert any(
        "did not accept the test message: SMTP server refused the message at DATA: 554 Transaction failed: spam "
        "(failure class content_rejected: a notification failing like this would be parked at once)" in text
        for text in texts(response)
    )


def test_send_test_email_reports_an_unreachable_server(admin_client_):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = SmtpConfiguration.objects.create(
        host="127.0.0.1", port=port, security="none", timeout_seconds=2, from_address="outbox@example.com"
    )
    response = admin_client_.post(
        reverse("admin:notifications_smtpconfiguration_send_test", args=[config.pk]), {"to": "ops@example.com"}
    )
    assert any(
        "did not accept the test message: SMTP connection refused at connect (failure class connection: "
        "a notification failing like this would be kept waiting while the channel is retried)" in text
        for text in texts(response)
    )


# --- Sites -----------------------------------------------------------------------------------


def test_sites_list_shows_last_seen_and_unrevoked_keys(admin_client_, site, site_key):
    content = admin_client_.get(reverse("admin:sites_site_changelist")).content.decode()
    assert "Last seen at" in content and "Unrevoked keys" in content
    assert '<td class="field-live_keys">1</td>' in content


def test_issue_key_shows_the_key_once_and_it_authenticates(admin_client_, site, client):
    url = reverse("admin:sites_site_issue_key", args=[site.pk])
    assert admin_client_.get(url).status_code == 405
    response = admin_client_.post(url)
    assert "no-store" in response["Cache-Control"]
    issued = re.search(r'id="issued-key"[^>]*>([^<]+)<', response.content.decode())
    assert issued is not None
    key = issued.group(1)
    assert cast(SiteAPIKey, SiteAPIKey.objects.get_from_key(key)).site == site
    change_page = admin_client_.get(reverse("admin:sites_site_change", args=[site.pk])).content.decode()
    assert key not in change_page
    assert key.split(".")[0] in change_page


def test_revoke_key_confirms_then_revokes_and_records_who(admin_client_, administrator, site, site_key):
    prefix = site_key.split(".")[0]
    url = reverse("admin:sites_site_revoke_key", args=[site.pk, prefix])
    assert b"cannot be undone" in admin_client_.get(url).content
    assert not SiteAPIKey.objects.get(prefix=prefix).revoked
    response = admin_client_.post(url, {"post": "yes"}, follow=True)
    assert SiteAPIKey.objects.get(prefix=prefix).revoked
    assert any(f"Revoked key {prefix}" in text for text in texts(response))
    from django.contrib.admin.models import LogEntry

    assert LogEntry.objects.filter(user=administrator, object_id=str(site.pk), change_message__contains=prefix).exists()


def test_revoking_an_unknown_prefix_says_so(admin_client_, site):
    response = admin_client_.post(reverse("admin:sites_site_revoke_key", args=[site.pk, "nope"]), follow=True)
    assert any("has no key with prefix nope" in text for text in texts(response))


def test_the_librarys_unused_api_key_model_is_not_in_the_admin(admin_client_):
    assert b"rest_framework_api_key" not in admin_client_.get(reverse("admin:index")).content


@pytest.mark.parametrize(
    "name, message",
    [
        ("\u041eperators", "Mixes Cyrillic and Latin letters"),
        ("Oper\u200bators", "invisible formatting characters"),
        ("OPERATORS ", "already exists (list names ignore case)"),
    ],
)
def test_the_console_refuses_look_alike_and_duplicate_list_names(admin_client_, name, message):
    NotificationList.objects.create(name="Operators")
    response = admin_client_.post(
        reverse("admin:notifications_notificationlist_add"),
        {
            "name": name,
            "description": "",
            "email_recipients-TOTAL_FORMS": "0",
            "email_recipients-INITIAL_FORMS": "0",
        },
    )
    assert response.status_code == 200
    assert message in response.content.decode()
    assert NotificationList.objects.count() == 1


def test_an_estimate_below_the_rows_found_never_cuts_the_page_short(operator_client, monkeypatch):
    # The planner can guess 1 row for a search that matches 50,000 (seen at 10,000,000 rows);
    # a count that cannot finish and such a guess are made here by hand: a small table gives
    # neither.
    from notifications import db

    if connection.vendor != "postgresql":
        pytest.skip("estimates are PostgreSQL's")
    monkeypatch.setattr(outbox_admin.NotificationAdmin, "list_per_page", 5)
    monkeypatch.setattr(db, "count_within", lambda queryset, milliseconds: None)
    monkeypatch.setattr(db, "planner_row_estimate", lambda queryset: 1)
    monkeypatch.setattr(db, "plan_reads_every_match", lambda queryset: False)
    for _ in range(12):
        make_notification(subject="pump tripped")
    cl = operator_client.get(OUTBOX, {"q": "tripped"}).context["cl"]
    assert cl.paginator.is_estimate
    assert len(cl.result_list) == 5 and cl.result_count == 6  # the page in full, and a next one
    last = operator_client.get(OUTBOX, {"q": "tripped", "p": "3"}).context["cl"]
    assert len(last.result_list) == 2 and last.result_count == 12


def test_a_page_whose_plan_reads_every_match_counts_them_in_the_same_pass(operator_client):
    if connection.vendor != "postgresql":
        pytest.skip("plans are PostgreSQL's")
    for _ in range(7):
        make_notification(subject="valve stuck open")
    for _ in range(3):
        make_notification(subject="pump tripped")
    with CaptureQueriesContext(connection) as captured:
        cl = operator_client.get(OUTBOX, {"q": "stuck"}).context["cl"]
    # A ten-row table is read whole and sorted: the page's query counts its matches itself.
    assert cl.result_count == 7 and not cl.paginator.is_estimate and len(cl.result_list) == 7
    # The page's own query counts its matches with COUNT(…) OVER () (the counts beside the
    # filters number their rows with row_number() OVER (), which is not a count of the page).
    page_queries = [q["sql"] for q in captured if re.search(r"COUNT\([^)]*\) OVER \(\)", q["sql"], re.I)]
    # The recent days (test_a_search_page_comes_from_the_recent_days_that_hold_it) hold too
    # few: then all the matches, once.
    assert len([sql for sql in page_queries if "AT TIME ZONE" not in sql]) == 1
    # No second pass counts the matches (the tiles' grouped counts of some of them aside).
    counts = [q["sql"].upper() for q in captured if "COUNT(*)" in q["sql"].upper() and "ILIKE" in q["sql"].upper()]
    assert not [sql for sql in counts if "GROUP BY" not in sql]


def test_a_search_page_comes_from_the_recent_days_that_hold_it(operator_client, monkeypatch):
    # 8 matches of the last hour, 20 of ten days ago (and as many rows that do not match): the
    # first page comes from the last day's matches, which hold it and one more; the second
    # page needs more than they hold, so it comes from all the matches, counted exactly.
    if connection.vendor != "postgresql":
        pytest.skip("plans are PostgreSQL's")
    monkeypatch.setattr(outbox_admin.NotificationAdmin, "list_per_page", 5)
    for age, count in ((timedelta(hours=1), 8), (timedelta(days=10), 20)):
        for n in range(count):
            make_notification(subject="pump tripped", age=age + timedelta(seconds=n))
            make_notification(subject="valve stuck", age=age + timedelta(seconds=n))
    newest_first = list(
        Notification.objects.filter(subject="pump tripped").order_by("-created_at", "-pk").values_list("pk", flat=True)
    )
    yesterday = outbox_admin.timezone.now().date() - timedelta(days=1)

    first = operator_client.get(OUTBOX, {"q": "tripped"})
    cl = first.context["cl"]
    assert [row.pk for row in cl.result_list] == newest_first[:5]
    assert cl.paginator.recent == (yesterday, 8) and cl.paginator.is_estimate and cl.result_count >= 8
    assert 'id="outbox-recent-note"' in first.content.decode()

    second = operator_client.get(OUTBOX, {"q": "tripped", "p": "2"})
    assert [row.pk for row in second.context["cl"].result_list] == newest_first[5:10]  # 3 of the last hour, 2 older
    assert second.context["cl"].paginator.recent is None and second.context["cl"].result_count == 28
    assert 'id="outbox-recent-note"' not in second.content.decode()


def test_a_search_in_another_order_reads_every_match(operator_client, monkeypatch):
    if connection.vendor != "postgresql":
        pytest.skip("plans are PostgreSQL's")
    monkeypatch.setattr(outbox_admin.NotificationAdmin, "list_per_page", 5)
    for n in range(12):
        make_notification(subject="pump tripped", age=timedelta(minutes=n))
    oldest_first = list(
        Notification.objects.filter(subject="pump tripped").order_by("created_at").values_list("pk", flat=True)
    )
    created = 1 + outbox_admin.NotificationAdmin.list_display.index("created_column")  # after the tick box
    cl = operator_client.get(OUTBOX, {"q": "tripped", "o": str(created)}).context["cl"]
    assert [row.pk for row in cl.result_list] == oldest_first[:5]
    assert cl.paginator.recent is None and not cl.paginator.is_estimate and cl.result_count == 12
