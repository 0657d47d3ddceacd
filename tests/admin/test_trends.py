"""Hourly trends on the dashboard: delivered / delivered partially / parked / failed per hour
over 24 h and 7 d, in total, by site and by channel, drawn as server-side SVG with a sparkline
on the tiles."""

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from notifications.charts import bar_chart, sparkline
from notifications.models import DeliveryAttempt, Notification
from notifications.trends import trends_compute
from tests.admin.conftest import make_notification

Status = Notification.Status
pytestmark = [pytest.mark.django_db]


def at(hours_ago, now):
    return now - timedelta(hours=hours_ago)


@pytest.fixture
def history():
    now = timezone.now()
    for hours_ago, site in ((0, "plant-a"), (0, "plant-a"), (3, "plant-b"), (30, "plant-a"), (200, "plant-a")):
        make_notification(
            status=Status.DELIVERED,
            source_site_id=site,
            delivered_at=at(hours_ago, now),
            age=timedelta(hours=hours_ago),
        )
    make_notification(status=Status.PARKED, source_site_id="plant-b", last_attempt_at=at(2, now))
    make_notification(
        status=Status.PARKED, source_site_id="plant-b", expired_at=at(50, now), last_attempt_at=at(1, now)
    )
    make_notification(status=Status.PENDING, source_site_id="plant-a")  # not in any series
    failing = make_notification(status=Status.RETRYING, source_site_id="plant-c")
    for hours_ago in (1, 1, 40):
        DeliveryAttempt.objects.create(
            notification=failing, started_at=at(hours_ago, now), outcome="transient", failure_class="connection"
        )
    DeliveryAttempt.objects.create(notification=failing, started_at=at(1, now), outcome="success")
    # Delivered to 2 of 3, one mailbox unknown: an attempt failed for the third while the two
    # had it (not an outage), then the third refused it for good.
    partial = make_notification(
        status=Status.DELIVERED, source_site_id="plant-b", delivered_at=at(2, now), age=timedelta(hours=3)
    )
    Notification.objects.filter(pk=partial.pk).update(targets_refused=1)
    DeliveryAttempt.objects.create(
        notification=partial,
        started_at=at(3, now),
        outcome="transient",
        failure_class="provider_error",
        targets_delivered=2,
    )
    DeliveryAttempt.objects.create(notification=partial, started_at=at(2, now), outcome="success", targets_delivered=2)
    return now


def test_24_hours_counts_each_metric_in_its_hour(history):
    trends = trends_compute(range_name="24h", now=history)
    assert trends.hours == 24 and len(trends.hour_starts()) == 24
    overall = trends.overall
    assert overall.counts["delivered"][23] == 2  # this hour
    assert overall.counts["delivered"][20] == 1  # 3 hours ago
    assert overall.counts["delivered"][21] == 1  # the partial delivery, 2 hours ago
    assert overall.total("delivered") == 4
    assert overall.counts["partial"][21] == 1 and overall.total("partial") == 1
    assert overall.counts["parked"][21] == 1 and overall.total("parked") == 1  # the other parked 50 h ago
    # The attempt that failed inside the partial delivery is not a failure of the chart.
    assert overall.counts["failed"][22] == 2 and overall.total("failed") == 2
    assert overall.counts["failed_partial"][20] == 1 and overall.total("failed_partial") == 1
    # Largest volume first; ties by name.
    assert list(trends.by_site) == ["plant-b", "plant-a", "plant-c"]
    assert trends.by_site["plant-a"].total("delivered") == 2
    assert trends.by_site["plant-b"].total("delivered") == 2
    assert trends.by_site["plant-b"].total("partial") == 1
    assert trends.by_site["plant-a"].total("partial") == 0
    assert trends.by_site["plant-b"].total("parked") == 1
    assert trends.by_site["plant-b"].total("failed") == 0
    assert trends.by_site["plant-c"].total("failed") == 2
    assert trends.by_channel["email"].total("delivered") == 4
    assert trends.by_channel["email"].total("partial") == 1


def test_7_days_reaches_further_back(history):
    trends = trends_compute(range_name="7d", now=history)
    assert trends.hours == 168
    assert trends.overall.total("delivered") == 5  # 200 h ago is outside
    assert trends.overall.total("partial") == 1
    assert trends.overall.total("parked") == 2
    assert trends.overall.total("failed") == 3
    with pytest.raises(ValueError, match="Unknown trend range '1y'"):
        trends_compute(range_name="1y")


def test_dashboard_draws_the_charts_and_tile_sparklines(operator_client, history):
    content = operator_client.get(reverse("admin:index")).content.decode()
    assert 'id="outbox-trends"' in content
    for metric in ("delivered", "partial", "parked", "failed"):
        assert f'class="outbox-chart outbox-chart-{metric}"' in content
    assert 'aria-label="Delivered per hour, last 24 hours: 4 in total, peak 2 at ' in content
    assert 'aria-label="Delivered partially per hour, last 24 hours: 1 in total, peak 1 at ' in content
    assert 'aria-label="Failed per hour, last 24 hours: 2 in total, peak 2 at ' in content
    # The failed chart says what it leaves out, and the legend what each series counts.
    note = re.search(r'id="trend-failed-note">(.*?)</span>', content, re.S)
    assert note and "not counted: 1 that failed for some recipients while others had it" in note[1]
    assert "Delivered partially: of those, the ones some recipient refused for good" in content
    assert '<th scope="col">delivered partially</th>' in content
    assert re.search(r'id="kpi-parked".*?<svg class="outbox-spark outbox-spark-parked"', content, re.S)
    assert 'id="trends-by-site"' in content and '<th scope="row">plant-c</th>' in content
    assert 'id="trends-by-channel"' in content
    week = operator_client.get(reverse("admin:index") + "?trends=7d").content.decode()
    assert "Trends, last 7 days" in week
    assert 'aria-label="Delivered per hour, last 7 days: 5 in total' in week
    # An unknown range falls back to 24 hours rather than failing.
    assert "Trends, last 24 hours" in operator_client.get(reverse("admin:index") + "?trends=bogus").content.decode()


def test_no_trends_for_staff_who_cannot_view_notifications(client, db):
    from tests.admin.conftest import make_user

    client.force_login(make_user("sam"))
    assert b"outbox-trends" not in client.get(reverse("admin:index")).content


def test_charts_escape_and_scale():
    now = timezone.now().replace(minute=0, second=0, microsecond=0)
    hours = [now - timedelta(hours=n) for n in range(3, -1, -1)]
    svg = bar_chart(values=[0, 5, 10, 0], hours=hours, metric="delivered", range_label="last <4> hours")
    assert "last &lt;4&gt; hours" in svg
    assert svg.count("<rect") == 2  # empty hours draw nothing
    heights = [float(h) for h in re.findall(r'<rect[^>]*height="([0-9.]+)"', svg)]
    assert heights[1] == pytest.approx(2 * heights[0])
    line = sparkline(values=[0, 0, 4], metric="parked", range_label="last 24 hours")
    assert 'aria-label="Parked per hour, last 24 hours: 4 in total, at most 4 in an hour."' in line


@pytest.mark.postgres
def test_delivered_trend_is_answered_from_the_partial_index_alone():
    if connection.vendor != "postgresql":
        pytest.skip("EXPLAIN plans are PostgreSQL's")
    since = timezone.now() - timedelta(days=7)
    with connection.cursor() as cursor:
        cursor.execute("SET enable_seqscan = off")
        cursor.execute(
            "EXPLAIN SELECT date_trunc('hour', delivered_at), source_site_id, type, count(delivered_at) "
            "FROM notifications_notification WHERE status = 'Delivered' AND delivered_at >= %s GROUP BY 1, 2, 3",
            [since],
        )
        plan = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("RESET enable_seqscan")
    assert "Index Only Scan using notif_trend_delivered_idx" in plan, plan
