"""Incident notes: what operators write on an open channel or a group of parked rows for the
next shift ("relay team called, ETA 04:00"), with who and when. Kept, never edited. A note is
not an acknowledgement: it changes no notification (``acknowledged_*`` stay as they are)."""

from typing import Any

from notifications.models import IncidentNote

# Notes shown per subject (newest first); older ones stay stored.
NOTES_SHOWN = 20


def incident_note_add(*, subject: str, text: str, user: Any) -> IncidentNote:
    """Store a note on ``subject`` ("channel:<name>" or "parked:<cause key>") by ``user``."""
    return IncidentNote.objects.create(subject=subject, text=text.strip(), author=user.get_username())


def incident_notes(*, subject: str) -> list[IncidentNote]:
    """The newest notes on ``subject`` (index incident_note_subject_idx)."""
    return list(IncidentNote.objects.filter(subject=subject).order_by("-created_at")[:NOTES_SHOWN])


def incident_notes_latest(*, subjects: list[str]) -> dict[str, IncidentNote]:
    """The newest note of each of ``subjects`` that has one."""
    latest: dict[str, IncidentNote] = {}
    for note in IncidentNote.objects.filter(subject__in=subjects).order_by("subject", "-created_at"):
        latest.setdefault(note.subject, note)
    return latest
