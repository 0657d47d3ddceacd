"""The console's view of sites: silent badges and backlogs on Sites, "Parked at sites" with its
filters, search, Retry and Discard-with-reason, and the commands' history."""

import uuid
from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.messages import get_messages
from django.urls import reverse
from django.utils import timezone

from sites.models import Site, SiteCommand, SiteHeartbeat, SiteParkedNotification
from tests.admin.conftest import login, make_notification, make_user

Parked = SiteParkedNotification.State
SITES = reverse("admin:sites_site_changelist")
PARKED_AT_SITES = reverse("admin:sites_siteparkednotification_changelist")
COMMANDS = reverse("admin:sites_sitecommand_changelist")
OUTBOX = reverse("admin:notifications_notification_changelist")


def messages_of(response):
    return [str(m) for m in get_messages(response.wsgi_request)]


def park(site, **fields):
    values = {
        "site": site,
        "notification_id": uuid.uuid4(),
        "type": "sms",
        "list_name": "Operators",
        "subject": "Pump 3 tripped",
        "reason": "Rejected by central: HTTP 400: invalid: type: Unknown notification type 'sms'.",
        "parked_at": timezone.now(),
        **fields,
    }
    return SiteParkedNotification.objects.create(**values)


@pytest.fixture
def operator_client(client, db):
    return login(client, make_user("olivia", groups=["Operators"]))


# --- Sites ---------------------------------------------------------------------------------------


def test_sites_show_backlog_parked_count_and_a_silent_badge_for_quiet_sites(admin_client, site, other_site, settings):
    settings.OUTBOX_SITE_SILENT_AFTER = 300
    SiteHeartbeat.objects.create(site=site, received_at=timezone.now(), buffered=17, parked=2, agent_version="0.3.0")
    SiteHeartbeat.objects.create(site=other_site, received_at=timezone.now() - timedelta(minutes=10), buffered=5)

    content = admin_client.get(SITES).content.decode()

    assert content.count('class="outbox-badge outbox-status-parked site-silent"') == 1
    assert "17" in content and "0.3.0" in content
    assert "site-direct" not in content  # both agents have heart-beated
    assert f"?site__id__exact={site.pk}" in content  # the parked count links to the site's rows


def test_a_site_that_only_posts_directly_shows_direct_with_its_last_post_never_silent(admin_client, site, settings):
    settings.OUTBOX_SITE_SILENT_AFTER = 300
    Site.objects.filter(pk=site.pk).update(last_seen_at=timezone.now() - timedelta(hours=2))
    quiet = Site.objects.create(site_id="plant-q", name="Never heard from")

    content = admin_client.get(SITES).content.decode()
    page = admin_client.get(reverse("admin:sites_site_change", args=[site.pk])).content.decode()

    assert content.count('class="outbox-badge outbox-direct site-direct"') == 1 and "last post " in content
    assert "site-silent" not in content
    assert "not heard from yet" in content and quiet.site_id in content
    assert "site-direct" in page and "it is never shown silent" in page


def test_a_site_change_page_shows_its_agents_latest_heartbeat(admin_client, site):
    SiteHeartbeat.objects.create(
        site=site, received_at=timezone.now(), buffered=3, parked=1, agent_version="0.3.0", last_error="HTTP 503"
    )
    content = admin_client.get(reverse("admin:sites_site_change", args=[site.pk])).content.decode()
    assert "3 buffered" in content and "1 parked" in content and "last error: HTTP 503" in content


def test_the_outbox_page_links_to_the_rows_parked_at_sites(operator_client, site):
    park(site)
    content = operator_client.get(OUTBOX).content.decode()
    assert 'id="parked-at-sites-link"' in content and "1 parked at sites" in content
    assert "0 silent" in content  # plant-a has never sent a heartbeat: direct, never silent


# --- Parked at sites ------------------------------------------------------------------------------


def test_parked_at_sites_lists_rows_still_parked_unless_asked_for_all(operator_client, site):
    parked = park(site, subject="Boiler low water")
    retried = park(site, subject="Valve stuck", state=Parked.RETRIED)

    default = operator_client.get(PARKED_AT_SITES).content.decode()
    every = operator_client.get(PARKED_AT_SITES, {"state": "all"}).content.decode()

    assert "Boiler low water" in default and "Valve stuck" not in default
    assert "Unknown notification type" in default
    assert str(parked.notification_id)[:8] in every and str(retried.notification_id)[:8] in every


def test_parked_at_sites_filters_by_site_and_searches_subject_reason_and_id(operator_client, site, other_site):
    ours = park(site, subject="Boiler low water")
    theirs = park(other_site, subject="Conveyor jam", reason="Retries exhausted after 50 attempts")

    by_site = operator_client.get(PARKED_AT_SITES, {"site__id__exact": other_site.pk}).content.decode()
    by_reason = operator_client.get(PARKED_AT_SITES, {"q": "exhausted"}).content.decode()
    by_id = operator_client.get(PARKED_AT_SITES, {"q": str(ours.notification_id)}).content.decode()

    assert "Conveyor jam" in by_site and "Boiler low water" not in by_site
    assert "Conveyor jam" in by_reason and "Boiler low water" not in by_reason
    assert "Boiler low water" in by_id and str(theirs.notification_id)[:8] not in by_id


def test_retry_at_the_site_sends_a_command_and_shows_it_pending(operator_client, site):
    row = park(site)
    response = operator_client.post(
        PARKED_AT_SITES, {"action": "retry_at_site", "_selected_action": [row.pk]}, follow=True
    )

    command = SiteCommand.objects.get()
    assert (command.action, command.state, command.notification_id) == ("retry", "pending", row.notification_id)
    assert command.created_by is not None and command.created_by.username == "olivia"
    assert any("Retry sent to the site's agent for 1 notification" in m for m in messages_of(response))
    assert "site-command-pending" in operator_client.get(PARKED_AT_SITES).content.decode()
    assert LogEntry.objects.filter(object_id=str(row.pk)).exists()


def test_discard_at_the_site_asks_for_a_reason_and_refuses_a_blank_one(operator_client, site):
    row = park(site)
    chosen = {"action": "discard_at_site", "_selected_action": [row.pk]}

    page = operator_client.post(PARKED_AT_SITES, chosen)
    blank = operator_client.post(PARKED_AT_SITES, {**chosen, "post": "yes", "reason": "  "})
    assert b"Reason (required)" in page.content
    assert blank.status_code == 200 and b"This field is required" in blank.content
    assert not SiteCommand.objects.exists()

    done = operator_client.post(
        PARKED_AT_SITES, {**chosen, "post": "yes", "reason": "Test rig, not a real pump"}, follow=True
    )
    command = SiteCommand.objects.get()
    assert (command.action, command.reason) == ("discard", "Test rig, not a real pump")
    assert any("Discard sent" in m for m in messages_of(done))


def test_a_viewer_without_the_site_permissions_sees_rows_but_no_actions(client, site):
    park(site)
    viewer = make_user("victor", permissions=["view_siteparkednotification"])
    content = login(client, viewer).get(PARKED_AT_SITES).content.decode()
    assert "Pump 3 tripped" in content and "retry_at_site" not in content and "discard_at_site" not in content


def test_a_row_delivered_after_a_retry_links_to_centrals_notification(operator_client, site):
    delivered = make_notification(status="Delivered", source_site_id=site.site_id)
    park(site, notification_id=delivered.notification_id, state=Parked.RETRIED)
    content = operator_client.get(PARKED_AT_SITES, {"state": "all"}).content.decode()
    assert reverse("admin:notifications_notification_change", args=[delivered.pk]) in content


def test_a_row_never_links_to_another_sites_notification(operator_client, site, other_site):
    # Stored before central refused such reports: plant-a's row names plant-b's notification.
    theirs = make_notification(status="Delivered", source_site_id=other_site.site_id)
    row = park(site, notification_id=theirs.notification_id)
    link = reverse("admin:notifications_notification_change", args=[theirs.pk])
    content = operator_client.get(PARKED_AT_SITES).content.decode()
    assert "Pump 3 tripped" in content and link not in content
    detail = operator_client.get(reverse("admin:sites_siteparkednotification_change", args=[row.pk]))
    assert detail.status_code == 200 and link not in detail.content.decode()


def test_the_command_history_shows_pending_done_and_failed(operator_client, site):
    rows = [park(site) for _ in range(3)]
    for row, state in zip(rows, ("pending", "done", "failed"), strict=True):
        SiteCommand.objects.create(site=site, notification_id=row.notification_id, action="retry", state=state)

    content = operator_client.get(COMMANDS).content.decode()

    for label in ("Pending", "Done", "Failed"):
        assert f">{label}</span>" in content
    detail = operator_client.get(
        reverse("admin:sites_siteparkednotification_change", args=[rows[2].pk])
    ).content.decode()
    assert "Failed" in detail and "Retry" in detail


def test_nobody_adds_edits_or_deletes_site_parked_rows_or_commands(admin_client, site):
    row = park(site)
    assert admin_client.get(reverse("admin:sites_siteparkednotification_add")).status_code == 403
    assert admin_client.post(reverse("admin:sites_siteparkednotification_delete", args=[row.pk])).status_code == 403
    assert admin_client.get(reverse("admin:sites_sitecommand_add")).status_code == 403
    assert Site.objects.count() == 1


def test_an_operator_sees_silent_sites_and_backlogs_on_the_outbox_page_and_reads_the_sites(operator_client, site):
    SiteHeartbeat.objects.create(site=site, received_at=timezone.now() - timedelta(hours=1), buffered=7)

    content = operator_client.get(OUTBOX).content.decode()

    assert "1 silent</a> (plant-a)" in content and "7 waiting at sites" in content
    # Operators read the sites' pages (read-only since the night view).
    assert operator_client.get(SITES).status_code == 200
