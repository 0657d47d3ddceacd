"""Notification list names: how they are written, compared and checked, in one place.

A site names the list a notification goes to; an operator names the lists in the console or the
configuration file; delivery finds the one by the other. All three go through these functions:

* **Normal form.** Unicode NFC, surrounding white space removed. Ingest stores names in this
  form, so ``"Operators "`` and ``"Operators"`` are one name.
* **Comparison.** Names match ignoring case by one rule: Python's full Unicode case folding of
  the normal form (``ΟΔΟΣ`` matches ``οδος``, ``STRASSE`` matches ``Straße``), with the dotted
  capital ``İ`` matching ``i`` (``İZMİR`` matches ``İzmir`` and ``Izmir``). It is applied here,
  in Python, never by the database's ``lower()``, whose result depends on the database's
  locale and differs from Python's for many scripts.
* **Checks.** A name must not contain control characters, line or paragraph separators or
  invisible formatting characters, and must not mix letters of several scripts (a Cyrillic
  ``О`` in ``Оperators`` looks exactly like the Latin name but is another one) beyond those one
  writing system uses together (Unicode's highly restrictive profile: ``ポンプ監視班`` is kanji
  and katakana, one Japanese name).
"""

import re
import unicodedata
from collections.abc import Iterable

from notifications.models import NotificationList

# Scripts of letters are told apart by the first word of their Unicode name ("LATIN SMALL
# LETTER A", "CYRILLIC CAPITAL LETTER O"); the standard library has no script property.
_SCRIPT_ALIASES = {
    "MODIFIER": "",
    "FULLWIDTH": "LATIN",
    "CJK": "HAN",
    "HALFWIDTH": "KATAKANA",  # HALFWIDTH KATAKANA LETTER …
    "KATAKANA-HIRAGANA": "",  # the prolonged sound mark ー belongs to both
}
# The script combinations that one writing system uses together, as Unicode's "highly
# restrictive" profile allows them (UTS #39, 5.2): Japanese mixes Han, Hiragana and Katakana
# (ポンプ監視班), Chinese Han and Bopomofo, Korean Han and Hangul — each with Latin.
_SCRIPT_FAMILIES = (
    frozenset({"LATIN", "HAN", "HIRAGANA", "KATAKANA"}),
    frozenset({"LATIN", "HAN", "BOPOMOFO"}),
    frozenset({"LATIN", "HAN", "HANGUL"}),
)


def list_name_normalize(name: str) -> str:
    """``name`` in its stored form: NFC, without surrounding white space."""
    return unicodedata.normalize("NFC", name).strip()


def list_name_key(name: str) -> str:
    """The comparison key of a list name: two names are the same list when their keys are
    equal (case-insensitive, by Unicode case folding of the normal form)."""
    # Case folding writes the dotted capital İ as i + COMBINING DOT ABOVE; dropping the dot lets
    # "İZMİR", "İzmir" and "Izmir" name one list (as a Turkish reader expects).
    return unicodedata.normalize("NFC", list_name_normalize(name).casefold().replace("i\u0307", "i"))


def _script(character: str) -> str:
    name = unicodedata.name(character, "")
    first = name.split(" ", 1)[0]
    return _SCRIPT_ALIASES.get(first, first)


def text_control_problem(value: str) -> str | None:
    """What makes ``value`` unfit for a one-line field that may end up in a mail header or a
    console cell, or None: C0 control characters other than TAB (CR, LF, VT, FF, ESC …), DEL,
    C1 control characters, and the Unicode line and paragraph separators."""
    found = _CONTROL_CHARACTER.search(value)  # one regular expression: this runs per delivery
    if found is None:
        return None
    code = ord(found.group())
    if code in (0x2028, 0x2029):
        return f"Must not contain line or paragraph separators (found U+{code:04X})."
    return f"Must not contain control characters (found U+{code:04X})."


# What :func:`text_control_problem` refuses: C0 but TAB, DEL and C1, the line and paragraph separators.
_CONTROL_CHARACTER = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")


def list_name_problem(name: str) -> str | None:
    """Why ``name`` (in normal form) cannot name a list, or None: a control character, an
    invisible formatting character (zero-width space, bidirectional override …), or letters of
    more than one script (a look-alike of another name) — except the scripts one writing system
    uses together (Japanese kanji with kana, and Latin with them)."""
    problem = text_control_problem(name)
    if problem:
        return problem
    scripts: set[str] = set()
    for character in name:
        category = unicodedata.category(character)
        if category == "Cf":
            return f"Must not contain invisible formatting characters (found U+{ord(character):04X})."
        if category.startswith("L"):
            script = _script(character)
            if script:
                scripts.add(script)
    if len(scripts) > 1 and not any(scripts <= family for family in _SCRIPT_FAMILIES):
        mixed = " and ".join(sorted(script.title() for script in scripts))
        return f"Mixes {mixed} letters; a name that looks like another one is refused."
    return None


def notification_lists_by_name(*, names: Iterable[str]) -> dict[str, NotificationList]:
    """The configured list each of ``names`` refers to, by that name as given; names no list
    answers to are absent. Lists are few (a configuration table), so all of them are read and
    compared here by :func:`list_name_key`, never by the database's idea of case."""
    wanted = {name: list_name_key(name) for name in names}
    if not wanted:
        return {}
    by_key: dict[str, NotificationList] = {}
    for notification_list in NotificationList.objects.only(
        "pk",
        "name",
        "recipient_mode",
        "resend_after_local_delivery",
        "ack_required_from",
        "escalation",
        "repeat_last_every_seconds",
    ).order_by("pk"):
        by_key.setdefault(list_name_key(notification_list.name), notification_list)
    return {name: by_key[key] for name, key in wanted.items() if key in by_key}


def notification_list_clash(*, name: str, exclude_pk: int | None = None) -> NotificationList | None:
    """Another configured list with the same comparison key as ``name`` (a duplicate), or None."""
    key = list_name_key(name)
    others = NotificationList.objects.only("pk", "name")
    if exclude_pk is not None:
        others = others.exclude(pk=exclude_pk)
    for notification_list in others:
        if list_name_key(notification_list.name) == key:
            return notification_list
    return None
