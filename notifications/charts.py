"""Server-side SVG charts for the dashboard (no JavaScript, no chart library): an hourly bar
chart and a sparkline. Colours come from CSS classes (admin.css), so both themes apply; every
chart carries a text alternative."""

from collections.abc import Sequence
from datetime import datetime

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

WIDTH, HEIGHT = 720, 150
LEFT, RIGHT, TOP, BOTTOM = 44, 8, 10, 22


def _hour_label(moment: datetime, *, daily: bool) -> str:
    return f"{moment:%a %d}" if daily else f"{moment:%H:%M}"


def bar_chart(
    *, values: Sequence[int], hours: Sequence[datetime], metric: str, range_label: str, label: str = ""
) -> SafeString:
    """Bars per hour of ``values`` (one per hour in ``hours``), with a y-axis maximum, time labels
    and a ``<title>`` per bar; ``metric`` names the series' CSS class ("partial"), ``label`` its
    words ("delivered partially"; the metric by default)."""
    label = label or metric
    count = len(values)
    peak = max(values, default=0)
    total = sum(values)
    top = max(peak, 1)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    step = plot_w / max(count, 1)
    gap = 1 if step > 3 else 0
    bars = []
    for index, (value, hour) in enumerate(zip(values, hours, strict=True)):
        if not value:
            continue
        height = max(1.0, plot_h * value / top)
        bars.append(
            (
                f"{LEFT + index * step:.1f}",
                f"{TOP + plot_h - height:.1f}",
                f"{max(step - gap, 0.5):.1f}",
                f"{height:.1f}",
                f"{hour:%Y-%m-%d %H:00} {hour.tzname() or 'UTC'}: {value} {label}",
            )
        )
    daily = count > 48
    every = 24 if daily else 6
    labels = [
        (f"{LEFT + index * step:.1f}", _hour_label(hour, daily=daily))
        for index, hour in enumerate(hours)
        if index % every == 0
    ]
    peak_hour = hours[values.index(peak)] if peak else None
    peak_at = f", peak {peak} at {peak_hour:%Y-%m-%d %H:00} {peak_hour.tzname() or 'UTC'}" if peak_hour else ""
    summary = f"{label.capitalize()} per hour, {range_label}: {total} in total{peak_at}."
    return format_html(
        '<svg class="outbox-chart outbox-chart-{}" viewBox="0 0 {} {}" role="img" aria-label="{}" '
        'preserveAspectRatio="none" width="100%" height="{}">'
        '<line class="outbox-chart-axis" x1="{}" y1="{}" x2="{}" y2="{}"></line>'
        '<text class="outbox-chart-text" x="{}" y="{}" text-anchor="end">{}</text>'
        '<text class="outbox-chart-text" x="{}" y="{}" text-anchor="end">0</text>'
        "{}{}</svg>",
        metric,
        WIDTH,
        HEIGHT,
        summary,
        HEIGHT,
        LEFT,
        TOP + plot_h,
        WIDTH - RIGHT,
        TOP + plot_h,
        LEFT - 4,
        TOP + 10,
        peak,
        LEFT - 4,
        TOP + plot_h,
        format_html_join(
            "",
            '<rect class="outbox-bar" x="{}" y="{}" width="{}" height="{}"><title>{}</title></rect>',
            bars,
        ),
        format_html_join(
            "",
            '<text class="outbox-chart-text" x="{}" y="{}">{}</text>',
            ((x, HEIGHT - 6, text) for x, text in labels),
        ),
    )


def sparkline(*, values: Sequence[int], metric: str, range_label: str, label: str = "") -> SafeString:
    """A small line of ``values`` (oldest first), scaled to its own maximum; ``metric`` names its
    CSS class, ``label`` its words (the metric by default)."""
    label = label or metric
    width, height = 100, 24
    if not values:
        return mark_safe("")
    top = max(max(values), 1)
    step = width / max(len(values) - 1, 1)
    points = " ".join(
        f"{index * step:.1f},{height - 2 - (height - 4) * value / top:.1f}" for index, value in enumerate(values)
    )
    return format_html(
        '<svg class="outbox-spark outbox-spark-{}" viewBox="0 0 {} {}" width="{}" height="{}" role="img" '
        'aria-label="{}"><polyline points="{}"></polyline></svg>',
        metric,
        width,
        height,
        width,
        height,
        f"{label.capitalize()} per hour, {range_label}: {sum(values)} in total, at most {max(values)} in an hour.",
        points,
    )
