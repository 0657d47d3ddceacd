"""Vendor SQL in one place: what the ORM cannot say, or says too slowly for the hot paths.

Every function here has a PostgreSQL form (production) and a portable form (SQLite, the
embedded default), and states the rule it serves so that callers (ingest, dispatch, the
console) read as rules. Column lists and column types come from the models' ``_meta``, never
from hand-typed lists, so a new column is carried along — or refused with a clear error.
"""

import json
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import date, datetime
from decimal import Decimal
from functools import cache
from typing import Any, TypeVar, cast

from django.core.exceptions import ImproperlyConfigured
from django.db import OperationalError, connection, transaction
from django.db.models import (
    DateField,
    DateTimeField,
    F,
    Field,
    Func,
    Index,
    IntegerField,
    Lookup,
    Model,
    OrderBy,
    Q,
    QuerySet,
    TextField,
)
from django.utils import timezone

ModelT = TypeVar("ModelT", bound=Model)
T = TypeVar("T")

# --- the database clock ------------------------------------------------------------------------


def database_now() -> datetime:
    """The database server's current time (aware, UTC). SQLite is embedded: there the process
    clock is the database clock."""
    if connection.vendor != "postgresql":
        return timezone.now()
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()")
        return cursor.fetchone()[0]


# --- row locks -------------------------------------------------------------------------------


def lock_skipping_locked(queryset: QuerySet[ModelT]) -> QuerySet[ModelT]:
    """``queryset`` locking its rows ``FOR UPDATE SKIP LOCKED`` where the database can (inside a
    transaction): rows another transaction holds are skipped, never waited for. SQLite has no
    row locks; its IMMEDIATE transactions serialise writers instead."""
    if connection.features.has_select_for_update_skip_locked:
        return queryset.select_for_update(skip_locked=True)
    return queryset


def read_in_index_order() -> None:
    """For the rest of the current transaction, have PostgreSQL read rows in an index's order
    rather than collect them and sort them (``enable_sort`` off, transaction-local:
    ``set_config(…, true)``, like ``SET LOCAL``, so it never outlives the transaction on a pooled
    connection, PgBouncer's transaction mode included). For the claim and the wake-time query,
    which take the first rows of each key of the claim index in its order (the measurements
    below were of the due index it replaced, read the same way). SQLite has no such choice.

    Measured need: statistics taken before a backlog arrived (a burst smaller than
    autovacuum's analyze threshold, a tenth of the table, never refreshes them) put every
    partial index of open rows at one row, and PostgreSQL then read the whole backlog through
    another of them (the KPIs' ``notif_queued_since_idx`` or ``notif_kpi_open_idx``) and sorted
    it, for every claim. At 10,000,000 rows with 20,000 queued after the last ANALYZE: 20,000
    rows read and sorted per claim of 200 (18–25 ms), and the wake-time query read 20,000
    rows (6 ms); with sorts off the due index was read, 200 rows (6–7.5 ms) and one row
    (0.02 ms). Sequential scans were never chosen: no switch for them.

    JIT compilation goes off with it: the claim still sorts its few candidates (ranking them
    takes window functions), each such sort is then priced as if forbidden, and a statement
    that expensive is JIT-compiled — 1.3 s of compiling for a claim of two rows, measured."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT set_config('enable_sort', 'off', true), set_config('jit', 'off', true)")


# The oldest expired rows, locked (skipping rows others hold), with their attempts and provider
# messages deleted; the attempts in a statement of their own, before their notifications, so
# that the failed-attempt counts' trigger still finds each attempt's notification.
_EXPIRED_BATCH_SQL = """
WITH batch AS (
    SELECT notification_id FROM notifications_notification
    WHERE status = ANY(%(statuses)s) AND created_at < %(created_before)s
    ORDER BY created_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED
), attempts AS (
    DELETE FROM notifications_deliveryattempt WHERE notification_id IN (SELECT notification_id FROM batch)
), messages AS (
    DELETE FROM notifications_providermessage WHERE notification_id IN (SELECT notification_id FROM batch)
)
SELECT coalesce(array_agg(notification_id), '{}') FROM batch
"""


def expired_batch_delete(*, statuses: Sequence[str], created_before: datetime, limit: int) -> tuple[int, int]:
    """PostgreSQL: delete the oldest ``limit`` rows in ``statuses`` created before
    ``created_before`` (skipping rows others hold), with their attempts and provider messages,
    in one transaction of two statements and no row read into Python: ``(rows taken, rows
    deleted)``. The status is checked again at the delete. The purge's batch: the ORM's cascade
    spent as much CPU in Python as PostgreSQL did deleting (66 µs a row), beside the sites'
    ingest on the same machine."""
    values = [str(status) for status in statuses]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_EXPIRED_BATCH_SQL, {"statuses": values, "created_before": created_before, "limit": limit})
        ids = cursor.fetchone()[0]
        if not ids:
            return 0, 0
        cursor.execute(
            "DELETE FROM notifications_notification WHERE notification_id = ANY(%s) AND status = ANY(%s)",
            [ids, values],
        )
        return len(ids), cursor.rowcount


class NullsFirstIndex(Index):
    """An index on one column in ``ASC NULLS FIRST`` order, for queries ordered that way (the
    claim takes rows without a due time first): a plain ascending index does not serve that
    order on PostgreSQL, which then sorts every matching row. SQLite already sorts NULLs first
    in ascending order, and refuses NULLS FIRST in CREATE INDEX: there it is a plain index."""

    def __init__(self, field_name: str, *, name: str, condition: Q | None = None) -> None:
        super().__init__(OrderBy(F(field_name), nulls_first=True), name=name, condition=condition)
        self.field_name = field_name

    def deconstruct(self) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
        path, _, kwargs = super().deconstruct()
        kwargs.pop("fields", None)
        return path, (self.field_name,), kwargs

    def create_sql(self, model: Any, schema_editor: Any, using: str = "", **kwargs: Any) -> Any:
        if schema_editor.connection.vendor == "sqlite":
            plain = Index(fields=[self.field_name], name=self.name, condition=self.condition)
            return plain.create_sql(model, schema_editor, using=using, **kwargs)
        return super().create_sql(model, schema_editor, using=using, **kwargs)


class DueTime(Func):
    """When an open row is due, as one sortable value: ``next_attempt_at``, or minus infinity for
    a row without one (due at once, before every dated row). On PostgreSQL written exactly as
    the claim index's last column (``DUE_TIME_SQL``), so that "due now" is one index range
    (``<= now``) instead of two (``IS NULL``, then ``<= now``). SQLite sorts NULL first already:
    there it is the column itself."""

    output_field = DateTimeField()

    def __init__(self) -> None:
        super().__init__(F("next_attempt_at"))

    def as_sql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, list[Any]]:  # type: ignore[override]
        sql, params = compiler.compile(self.source_expressions[0])
        if connection.vendor == "postgresql":
            return f"COALESCE({sql}, '-infinity'::timestamptz)", list(params)
        return sql, list(params)


# The due time of DueTime, in the claim's SQL (notifications.dispatch.fair).
DUE_TIME_SQL = "COALESCE(next_attempt_at, '-infinity'::timestamptz)"
# The claim index's key columns, in its order: one key per (site, priority, channel).
CLAIM_KEY_COLUMNS = ("source_site_id", "priority", "type")
CLAIM_INCLUDED = ("list_name",)


class ClaimIndex(Index):
    """The claim's index: open rows by site, priority and channel, each key's rows in due order
    (:class:`DueTime`: rows without a due time first). Give it ``condition`` (the open rows).
    SQLite has no use for the expression (it sorts NULL first): there the plain columns."""

    def __init__(self, *, name: str, condition: Q | None = None) -> None:
        # The list name rides along (INCLUDE) for the KPIs' deliveries per site: the open rows
        # by site, channel and list, read from the index alone where PostgreSQL can.
        super().__init__(
            *(F(column) for column in CLAIM_KEY_COLUMNS),
            DueTime(),
            name=name,
            condition=condition,
            include=CLAIM_INCLUDED,
        )

    def deconstruct(self) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
        path, _, kwargs = super().deconstruct()
        kwargs.pop("expressions", None)
        kwargs.pop("include", None)
        return path, (), kwargs

    def create_sql(self, model: Any, schema_editor: Any, using: str = "", **kwargs: Any) -> Any:
        if schema_editor.connection.vendor == "sqlite":
            plain = Index(fields=[*CLAIM_KEY_COLUMNS, "next_attempt_at"], name=self.name, condition=self.condition)
            return plain.create_sql(model, schema_editor, using=using, **kwargs)
        return super().create_sql(model, schema_editor, using=using, **kwargs)


def claim_keys_cte(open_rows: str) -> str:
    """``keys(s, p, t)`` (for a ``WITH RECURSIVE``): every (site, priority, channel) with open
    rows, one probe of the claim index each — a recursive "loose index scan", each step taking
    the first key after the last one found. ``open_rows``: the open-row condition on alias
    ``o`` (the index's predicate, so that the index serves it). There are tens of keys, never
    millions."""
    site, priority, channel = CLAIM_KEY_COLUMNS
    table = "notifications_notification"
    first = (
        f"SELECT {site} AS s, {priority} AS p, {channel} AS t FROM {table} AS o WHERE {open_rows} "
        f"ORDER BY {site}, {priority}, {channel} LIMIT 1"
    )
    following = (
        f"SELECT {site} AS s, {priority} AS p, {channel} AS t FROM {table} AS o WHERE {open_rows} "
        f"AND ({site}, {priority}, {channel}) > (k.s, k.p, k.t) ORDER BY {site}, {priority}, {channel} LIMIT 1"
    )
    return (
        f"keys AS (({first}) UNION ALL SELECT nk.s, nk.p, nk.t FROM keys AS k CROSS JOIN LATERAL ({following}) AS nk)"
    )


# --- rows by primary key ------------------------------------------------------------------------


class AnyOf(Lookup):
    """``lhs = ANY(array)``: ``field__any=[…]`` binds the whole list as one array parameter.
    Django's ``__in`` binds one parameter per value, and psycopg's client-side binding then
    parses a statement as long as the list on every call (a dispatch batch is 200 ids)."""

    lookup_name = "any"
    prepare_rhs = False

    def get_db_prep_lookup(self, value: Any, connection: Any) -> tuple[str, tuple[Any, ...]]:
        field = self.lhs.output_field
        items = [field.get_db_prep_value(item, connection, prepared=False) for item in value]
        literal = uuid_array_literal(items)
        if literal is not None:
            return "CAST(%s AS uuid[])", (literal,)
        return "%s", (items,)

    def as_sql(self, compiler: Any, connection: Any) -> tuple[str, tuple[Any, ...]]:
        lhs, lhs_params = self.process_lhs(compiler, connection)
        rhs, rhs_params = self.process_rhs(compiler, connection)
        return f"{lhs} = ANY({rhs})", (*lhs_params, *rhs_params)


Field.register_lookup(AnyOf)


class EqualsUnindexed(Lookup):
    """``lhs IS NOT DISTINCT FROM rhs`` (SQLite: ``lhs IS rhs``): equality, for a NOT NULL
    column, that the database checks on the rows it has found but never uses to find them.

    For a condition that only confirms rows found by their primary keys (a worker finishing
    the rows it claimed, still in the status it claimed them with). Plain ``=`` lets PostgreSQL
    weigh the indexes on the column too, and with statistics taken before a backlog arrived
    ("a handful of Pending rows") it read all 20,000 Pending rows through the status index to
    finish 100 of them; ``IS NOT DISTINCT FROM`` matches no index, so the primary key it is."""

    lookup_name = "equals_unindexed"

    def as_sql(self, compiler: Any, connection: Any) -> tuple[str, tuple[Any, ...]]:
        lhs, lhs_params = self.process_lhs(compiler, connection)
        rhs, rhs_params = self.process_rhs(compiler, connection)
        operator = "IS NOT DISTINCT FROM" if connection.vendor == "postgresql" else "IS"
        return f"{lhs} {operator} {rhs}", (*lhs_params, *rhs_params)


Field.register_lookup(EqualsUnindexed)


def uuid_array_literal(values: Sequence[Any]) -> str | None:
    """``values``, when every one is a UUID, as the text of a PostgreSQL ``uuid[]`` (cast it):
    one string parameter, which psycopg's client-side binding quotes at once, where a list is
    dumped value by value (for a batch of 200 ids, about half the cost). None otherwise."""
    if not values or not all(type(value) is uuid.UUID for value in values):
        return None
    return "{" + ",".join(value.hex for value in values) + "}"


def pk_in(pks: Collection[Any]) -> Q:
    """A filter: the primary key is one of ``pks``. On PostgreSQL one array parameter
    (:class:`AnyOf`), elsewhere Django's ``pk__in``."""
    if connection.vendor == "postgresql":
        return Q(pk__any=list(pks))
    return Q(pk__in=list(pks))


# --- one row per value ----------------------------------------------------------------------------


def insert_for_each(
    model: type[ModelT], *, column: str, values: Sequence[Any], common: Mapping[str, Any]
) -> list[ModelT]:
    """Insert one row of ``model`` per value of ``column`` (distinct values), every row with the
    same ``common`` values and the model's defaults for the other columns; returns the rows as
    objects, with their primary keys, in the order of ``values``.

    On PostgreSQL one ``INSERT … SELECT FROM unnest(array)``: ``bulk_create`` binds every value
    of every row as a parameter of its own, and parsing that statement costs more than the
    insert itself."""
    if not values:
        return []
    if connection.vendor != "postgresql":
        return model._default_manager.bulk_create([model(**{column: value}, **common) for value in values])
    meta = model._meta
    varying = cast(Field, meta.get_field(column))
    sql, slots = _postgresql_insert_for_each(model, varying.attname, tuple(sorted(common)))
    params = [
        cast(Field, meta.get_field(value)).get_db_prep_save(common[value], connection) if is_common else value
        for is_common, value in slots
    ]
    array = [varying.get_db_prep_save(value, connection) for value in values]
    params.append(uuid_array_literal(array) or array)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        keys = dict(cursor.fetchall())
    # The rows are in the database now: their objects are built as loaded rows are, each with
    # the defaults a new object would get (a callable default called once per object).
    assert meta.pk is not None
    fields = meta.concrete_fields
    base: dict[str, Any] = {}
    called: list[Field] = []
    for field in fields:
        name = field.attname
        if name in common:
            base[name] = common[name]
        elif name != varying.attname and field is not meta.pk:
            if field.has_default() and callable(field.default):
                called.append(field)
            else:
                base[name] = field.get_default()
    names = [field.attname for field in fields]
    objects = []
    for value in values:
        attributes = {**base, varying.attname: value, meta.pk.attname: keys[varying.to_python(value)]}
        for field in called:
            attributes[field.attname] = field.get_default()
        objects.append(model.from_db(connection.alias, names, [attributes[name] for name in names]))
    return objects


@cache
def _postgresql_insert_for_each(
    model: type[Model], varying: str, common: tuple[str, ...]
) -> tuple[str, list[tuple[bool, Any]]]:
    """The ``INSERT … SELECT FROM unnest`` statement of :func:`insert_for_each`, built once per
    shape, and where each parameter before the array comes from: ``(True, attname)`` a common
    value, ``(False, value)`` a model default, ready for the database."""
    meta = model._meta
    pk = meta.pk
    assert pk is not None
    columns, selects = [], []
    slots: list[tuple[bool, Any]] = []
    for field in meta.concrete_fields:
        if field is pk and field.db_returning:
            continue  # generated by the database
        columns.append(_column(field))
        if field.attname == varying:
            selects.append("v.value")
            continue
        selects.append(f"CAST(%s AS {field.db_type(connection)})")
        if field.attname in common:
            slots.append((True, field.attname))
            continue
        default = field.get_default()
        if default is None and not field.null:
            raise ImproperlyConfigured(f"{meta.label}.{field.name} is neither submitted nor defaulted")
        slots.append((False, field.get_db_prep_save(default, connection)))
    unknown = sorted(set(common) - {f.attname for f in meta.concrete_fields})
    if unknown:
        raise ImproperlyConfigured(f"{meta.label} has no columns {unknown}")
    array_type = f"{cast(Field, meta.get_field(varying)).db_type(connection)}[]"
    sql = (
        f"INSERT INTO {connection.ops.quote_name(meta.db_table)} ({', '.join(columns)}) "
        f"SELECT {', '.join(selects)} FROM unnest(CAST(%s AS {array_type})) AS v(value) "
        f"RETURNING {_column(meta.get_field(varying))}, {_column(pk)}"
    )
    return sql, slots


# --- idempotent insert ---------------------------------------------------------------------------


def insert_ignoring_conflicts(
    model: type[Model],
    rows: Sequence[Mapping[str, Any]],
    *,
    stamped: Collection[str] = (),
    stamped_if_null: Collection[str] = (),
) -> dict[Any, datetime]:
    """Insert those of ``rows`` whose primary key does not exist yet, in one statement
    (``INSERT … ON CONFLICT DO NOTHING RETURNING``); returns ``{pk: stamp}`` of the rows it
    inserted, where ``stamp`` is the statement's time.

    Every row maps the same attribute names to values. Columns in ``stamped`` take the
    statement's time, columns in ``stamped_if_null`` take it where the row's value is None,
    and every other column takes its model default — read once per statement shape, so a
    default that must differ per row (a fresh id, a time) has to be submitted or stamped. On
    PostgreSQL the time is the database's clock; SQLite is embedded, so there it is the
    process clock.

    Called outside a transaction (as ingest does) the insert is committed when this returns.
    PostgreSQL makes a concurrent inserter of the same key wait for the first one's commit.
    Django's ``bulk_create(ignore_conflicts=True)`` cannot say which rows it inserted.
    """
    if not rows:
        return {}
    submitted = tuple(rows[0])
    pk = model._meta.pk
    assert pk is not None
    if connection.vendor == "postgresql":
        sql, default_params = _postgresql_insert(model, submitted, tuple(stamped), tuple(stamped_if_null))
        with connection.cursor() as cursor:
            cursor.execute(sql, [*default_params, rows_document(rows)])
            return {pk.to_python(key): stamp for key, stamp in cursor.fetchall()}

    now = timezone.now()
    fields = model._meta.concrete_fields
    quote = connection.ops.quote_name
    columns = ", ".join(_column(f) for f in fields)
    one_row = "(" + ", ".join(["%s"] * len(fields)) + ")"
    sql = (
        f"INSERT INTO {quote(model._meta.db_table)} ({columns}) VALUES {', '.join([one_row] * len(rows))} "
        f"ON CONFLICT ({_column(pk)}) DO NOTHING RETURNING {_column(pk)}"
    )
    defaults = {f.attname: f.get_default() for f in fields if f.attname not in submitted}
    params: list[Any] = []
    for row in rows:
        values = {**defaults, **row, **dict.fromkeys(stamped, now)}
        for name in stamped_if_null:
            if values[name] is None:
                values[name] = now
        params.extend(f.get_db_prep_save(values[f.attname], connection) for f in fields)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return {pk.to_python(key): now for (key,) in cursor.fetchall()}


def rows_document(rows: Sequence[Mapping[str, Any]]) -> str:
    """``rows`` as the JSON document the PostgreSQL insert reads (jsonb_to_recordset): binding
    every value of every row as its own parameter costs more than the insert itself."""
    return json.dumps(list(rows), default=_json_value, ensure_ascii=False)


def insert_ignoring_conflicts_sql(
    model: type[Model],
    submitted: tuple[str, ...],
    *,
    stamped: tuple[str, ...] = (),
    stamped_if_null: tuple[str, ...] = (),
    rows: str = "%s::jsonb",
    returning: tuple[str, ...] = (),
) -> tuple[str, list[Any]]:
    """PostgreSQL: the statement :func:`insert_ignoring_conflicts` runs, for rows with the
    attributes ``submitted``, with more in it: it returns ``(pk, statement_timestamp(),
    *returning)`` of each row inserted (``returning``: SQL of the inserted row's columns).
    ``rows``: the SQL of the rows document the rows are read from — the document itself, or a
    function of it that returns the rows as they are to be stored (``f(%s::jsonb, %s, …)``).
    Its parameters: the returned list, :func:`rows_document` of the rows, then those of the
    rest of ``rows``. Built once per shape."""
    return _postgresql_insert(model, submitted, stamped, stamped_if_null, rows, returning)


@cache
def _postgresql_insert(
    model: type[Model],
    submitted: tuple[str, ...],
    stamped: tuple[str, ...],
    stamped_if_null: tuple[str, ...],
    rows: str = "%s::jsonb",
    returning: tuple[str, ...] = (),
) -> tuple[str, list[Any]]:
    """The INSERT … SELECT FROM jsonb_to_recordset statement and its default-value parameters;
    built once per shape (``db_type()`` per field per request would cost more than the rest of
    the Python side of an ingest)."""
    meta = model._meta
    quote = connection.ops.quote_name
    by_name = {f.attname: f for f in meta.concrete_fields}
    unknown = sorted(set(submitted) - set(by_name))
    if unknown:
        raise ImproperlyConfigured(f"{meta.label} has no columns {unknown}")
    record = ", ".join(f"{_column(by_name[name])} {by_name[name].db_type(connection)}" for name in submitted)
    selects, params = [], []
    for field in meta.concrete_fields:
        column = f"r.{_column(field)}"
        if field.attname in stamped:
            selects.append("statement_timestamp()")
        elif field.attname in submitted:
            selects.append(f"COALESCE({column}, statement_timestamp())" if field.attname in stamped_if_null else column)
        else:
            default = field.get_default()
            if default is None and not field.null:
                raise ImproperlyConfigured(f"{meta.label}.{field.name} is neither submitted, stamped nor defaulted")
            selects.append(f"CAST(%s AS {field.db_type(connection)})")
            params.append(field.get_db_prep_save(default, connection))
    pk = _column(meta.pk) if meta.pk else ""
    sql = (
        f"INSERT INTO {quote(meta.db_table)} ({', '.join(_column(f) for f in meta.concrete_fields)}) "
        f"SELECT {', '.join(selects)} FROM jsonb_to_recordset({rows}) AS r({record}) "
        f"ON CONFLICT ({pk}) DO NOTHING RETURNING {', '.join((pk, 'statement_timestamp()', *returning))}"
    )
    return sql, params


# --- values fit for storage ---------------------------------------------------------------------


def storable(value: Any) -> Any:
    """``value`` with every string in it (nested in dicts and lists too, keys included) made
    storable in any supported database: NUL written as ``\\x00`` (PostgreSQL refuses NUL in text
    and in jsonb), unpaired surrogates (not encodable as UTF-8) replaced by U+FFFD.

    For text that comes from outside and is only recorded, never matched on — a remote server's
    reply, an exception's message: one such value must never make a whole transaction of results
    fail. Input that is matched on (ingest) is validated instead and refused."""
    if isinstance(value, str):
        if "\x00" in value:
            value = value.replace("\x00", "\\x00")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            value = "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in value)
        return value
    if isinstance(value, (dict, list)) and _storable_as_is(value):
        return value  # the common case, checked in one pass of C code rather than per string
    if isinstance(value, dict):
        return {storable(key): storable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [storable(item) for item in value]
    return value


def storable_with_text(value: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """:func:`storable` of ``value`` and the JSON text of the result, keys sorted (equal values,
    equal texts: a key to group by). Written once where nothing needs repair, as almost always."""
    try:
        text = json.dumps(value, ensure_ascii=False, default=str, sort_keys=True)
        if _text_storable(text):
            return value, text
    except ValueError:  # a value JSON cannot write as it is (a circular one): the careful way
        pass
    repaired = storable(value)
    return repaired, json.dumps(repaired, ensure_ascii=False, default=str, sort_keys=True)


def _text_storable(text: str) -> bool:
    """True when JSON ``text`` holds no NUL escape and encodes as UTF-8 (no unpaired surrogate);
    False also for a string that holds the six characters of the escape: the careful way then
    decides."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\\u0000" not in text


def _storable_as_is(value: dict[Any, Any] | list[Any]) -> bool:
    """True when no string in ``value`` needs :func:`storable`'s repair: its JSON text (which
    writes NUL as ``\\u0000`` and keeps an unpaired surrogate as it is) holds no NUL escape
    and encodes as UTF-8. False when in doubt (a value JSON cannot write, a string that holds
    the six characters of the escape): the item-by-item repair then decides."""
    try:
        text = json.dumps(value, ensure_ascii=False, default=str)
    except Exception:  # noqa: BLE001 - whatever JSON cannot write as it is goes the careful way
        return False
    return _text_storable(text)


# --- batch update by primary key --------------------------------------------------------------


def update_by_pk(objects: Sequence[Model], fields: Sequence[str]) -> None:
    """Write ``fields`` of ``objects`` (all of one model) back, matched by primary key, every
    value made :func:`storable` (on the object too, so it holds what was written).

    On PostgreSQL this is one ``UPDATE … FROM jsonb_to_recordset``: Django's ``bulk_update``
    builds a CASE per row and field, which costs more than the work being recorded.
    """
    if not objects:
        return
    model = type(objects[0])
    if connection.vendor != "postgresql":
        _storable_fields(objects, fields)
        model._default_manager.bulk_update(objects, list(fields), batch_size=200)
        return
    sql = _postgresql_update(model, tuple(fields))
    pk_name = model._meta.pk.attname if model._meta.pk else "pk"

    def document() -> str:
        return json.dumps(
            [{pk_name: obj.pk, **{name: getattr(obj, name) for name in fields}} for obj in objects],
            default=_json_value,
            ensure_ascii=False,
        )

    # The whole document is checked once; only one that needs repair is repaired value by value.
    text = document()
    if not _text_storable(text):
        _storable_fields(objects, fields)
        text = document()
    with connection.cursor() as cursor:
        cursor.execute(sql, [text])


def _storable_fields(objects: Sequence[Model], fields: Sequence[str]) -> None:
    for obj in objects:
        for name in fields:
            setattr(obj, name, storable(getattr(obj, name)))


@cache
def _postgresql_update(model: type[Model], fields: tuple[str, ...]) -> str:
    meta = model._meta
    quote = connection.ops.quote_name
    pk = meta.pk
    assert pk is not None
    chosen: list[Field] = [pk, *(cast(Field, meta.get_field(name)) for name in fields)]
    record = ", ".join(f"{_column(f)} {f.db_type(connection)}" for f in chosen)
    assignments = ", ".join(f"{_column(f)} = r.{_column(f)}" for f in chosen[1:])
    return (
        f"UPDATE {quote(meta.db_table)} AS t SET {assignments} "
        f"FROM jsonb_to_recordset(%s::jsonb) AS r({record}) WHERE t.{_column(pk)} = r.{_column(pk)}"
    )


def _column(field: Any) -> str:
    """The quoted column name of a concrete field."""
    assert field.column is not None, f"{field} has no column"
    return connection.ops.quote_name(field.column)


def _json_value(value: Any) -> Any:
    """JSON for the values json cannot encode itself (full precision; no rounding of times)."""
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, (uuid.UUID, Decimal)):
        return str(value)
    raise TypeError(f"cannot encode {type(value).__name__} for the database")


# --- planner estimates ------------------------------------------------------------------------


def planner_row_estimate(queryset: QuerySet[Any]) -> int | None:
    """PostgreSQL's planner estimate of the rows ``queryset`` returns, read from ``EXPLAIN``
    without running it; None where the database gives none (SQLite)."""
    plan = _plan(queryset)
    return None if plan is None else int(plan["Plan Rows"])


def plan_reads_every_match(queryset: QuerySet[Any]) -> bool:
    """True when PostgreSQL's plan for ``queryset`` (a sliced, ordered query: a page) reads
    every matching row and sorts them to take the page (a bitmap scan of a search's trigram
    index, say), rather than reading rows already in order until the page is full. Counting
    the matches in that same pass then costs next to nothing. False on SQLite."""
    plan = _plan(queryset)
    if plan is None or plan["Node Type"] != "Limit":
        return False
    below = plan.get("Plans", [{}])[0]
    return below.get("Node Type") == "Sort"


def _plan(queryset: QuerySet[Any]) -> dict[str, Any] | None:
    """The top node of PostgreSQL's plan for ``queryset`` (EXPLAIN, not run); None on SQLite."""
    if connection.vendor != "postgresql":
        return None
    sql, params = queryset.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        plan = cursor.fetchone()[0]
    if isinstance(plan, str):
        plan = json.loads(plan)
    return cast(dict[str, Any], plan[0]["Plan"])


def count_within(queryset: QuerySet[Any], milliseconds: int) -> int | None:
    """``queryset.count()``, or None when PostgreSQL has not finished it within ``milliseconds``
    (the statement is cancelled; the connection and any enclosing transaction stay usable).
    SQLite has no statement timeout: there it always counts."""
    return run_within(queryset.count, milliseconds)


def grouped_counts(
    values: QuerySet[Any], *, columns: Sequence[str], first: int | None = None
) -> tuple[dict[tuple[Any, ...], int], int]:
    """How many of the rows of ``values`` (a ``values_list`` of ``columns``, sliced or not)
    hold each combination of values, counted by the database over exactly those rows (a LIMIT
    inside stays inside; the rows never travel one by one), and how many rows that was.
    ``first``: count only the first so many rows in the order ``values`` returns them (its
    ORDER BY), the rows after them only in the number read."""
    sql, params = values.query.sql_with_params()
    names = ", ".join(columns)
    if first is None:
        query, arguments = f"SELECT {names}, count(*), count(*) FROM ({sql}) AS counted GROUP BY {names}", params
    else:
        # row_number() over () numbers the rows in the order the ordered inner query gives them.
        query = (
            f"SELECT {names}, count(*) FILTER (WHERE row_in_order <= %s), count(*) FROM "
            f"(SELECT *, row_number() OVER () AS row_in_order FROM ({sql}) AS ordered) AS counted GROUP BY {names}"
        )
        arguments = (first, *params)
    with connection.cursor() as cursor:
        cursor.execute(query, arguments)
        rows = cursor.fetchall()
    counts = {tuple(row[:-2]): int(row[-2]) for row in rows if row[-2]}
    return counts, sum(int(row[-1]) for row in rows)


def run_within(read: Callable[[], T], milliseconds: int) -> T | None:
    """``read()``, or None when PostgreSQL has not answered its statements within
    ``milliseconds`` each (a statement timeout local to a savepoint: the statement is
    cancelled, the connection and any enclosing transaction stay usable). SQLite has no
    statement timeout: there it always reads."""
    if connection.vendor != "postgresql":
        return read()
    from psycopg.errors import QueryCanceled

    try:
        with transaction.atomic(), connection.cursor() as cursor:
            # Local to this (sub)transaction: set back below, or undone by its rollback.
            cursor.execute(
                "SELECT current_setting('statement_timeout'), set_config('statement_timeout', %s, true)",
                [str(milliseconds)],
            )
            previous = cursor.fetchone()[0]
            result = read()
            cursor.execute("SELECT set_config('statement_timeout', %s, true)", [previous])
            return result
    except OperationalError as error:
        if isinstance(error.__cause__, QueryCanceled):
            return None
        raise


# --- case-insensitive search ------------------------------------------------------------------


class ILike(Lookup):
    """``lhs ILIKE rhs``. Unlike Django's ``icontains`` (``UPPER(…) LIKE UPPER(…)``) this can
    use a trigram GIN index (the console's search index). A filter expression only."""

    lookup_name = "ilike"

    def as_sql(self, compiler: Any, connection: Any) -> tuple[str, tuple[Any, ...]]:
        lhs, lhs_params = self.process_lhs(compiler, connection)
        rhs, rhs_params = self.process_rhs(compiler, connection)
        return f"{lhs} ILIKE {rhs}", (*lhs_params, *rhs_params)


# --- text ---------------------------------------------------------------------------------------


class TextConcat(Func):
    """``a || b || …`` as text. Django's Concat wraps each part in COALESCE with a value of
    another type, which it then refuses to mix with a TextField; the columns joined here are
    never NULL, and ``||`` means the same on PostgreSQL and SQLite."""

    arg_joiner = " || "
    template = "(%(expressions)s)"
    output_field = TextField()


# --- the console's search and parked causes ---------------------------------------------------

# The columns the console's search looks in, joined by a space; on PostgreSQL one GIN index
# answers the search: a trigram index on exactly this expression, with the UTC day each row was
# created (CREATED_DAY_SQL) as its second column, so a search limited to recent days reads only
# the matches of those days (migration 0016_search_index_by_day).
SEARCH_COLUMNS = ("subject", "list_name", "last_error", "source_instance_id", "source_script")
SEARCH_TEXT_SQL = "(" + " || ' ' || ".join(SEARCH_COLUMNS) + ")"
CREATED_DAY_SQL = "((created_at AT TIME ZONE 'UTC')::date)"
SEARCH_INDEX_COLUMNS_SQL = f"({SEARCH_TEXT_SQL} gin_trgm_ops, {CREATED_DAY_SQL})"

# A parked row's cause: the start of its last error (the grouping key of the parked-by-cause
# view). On PostgreSQL a partial index of Parked rows holds the last error itself (with list,
# site and created) for errors up to CAUSE_INDEXED_BYTES, so the grouping is an index-only
# scan (PostgreSQL does not answer an expression like left() from an index alone); the rare
# longer errors have an index of their own (migration 0012_console_outbox).
CAUSE_LENGTH = 200
CAUSE_INDEXED_BYTES = 2000


class OctetLength(Func):
    """``octet_length(text)``: its length in bytes (PostgreSQL)."""

    function = "octet_length"
    output_field = IntegerField()


class SearchText(Func):
    """The searched columns joined by a space, written exactly as the trigram index's expression."""

    output_field = TextField()

    def __init__(self) -> None:
        super().__init__(*(F(name) for name in SEARCH_COLUMNS))

    def as_sql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, list[Any]]:  # type: ignore[override]
        parts, params = [], []
        for expression in self.source_expressions:
            sql, part_params = compiler.compile(expression)
            parts.append(sql)
            params.extend(part_params)
        return "(" + " || ' ' || ".join(parts) + ")", params


class CreatedDay(Func):
    """The UTC calendar day of ``created_at``: on PostgreSQL written exactly as the search
    index's second column (CREATED_DAY_SQL); SQLite keeps times in UTC, so its ``date()``."""

    output_field = DateField()

    def __init__(self) -> None:
        super().__init__(F("created_at"))

    def as_sql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, list[Any]]:  # type: ignore[override]
        sql, params = compiler.compile(self.source_expressions[0])
        if connection.vendor == "postgresql":
            return f"(({sql} AT TIME ZONE 'UTC')::date)", list(params)
        return f"date({sql})", list(params)


class ParkedCause(Func):
    """The first CAUSE_LENGTH characters of ``last_error``, written as the cause index's expression."""

    output_field = TextField()

    def __init__(self) -> None:
        super().__init__(F("last_error"))

    def as_sql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, list[Any]]:  # type: ignore[override]
        sql, params = compiler.compile(self.source_expressions[0])
        function = "left" if connection.vendor == "postgresql" else "substr"
        if function == "left":
            return f"left({sql}, {CAUSE_LENGTH})", list(params)
        return f"substr({sql}, 1, {CAUSE_LENGTH})", list(params)


def text_contains_ignoring_case(text: str) -> Q | ILike:
    """A filter: the searched columns (SEARCH_COLUMNS) contain ``text``, ignoring case; on
    PostgreSQL an ILIKE that the search trigram index answers."""
    if connection.vendor == "postgresql":
        escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        return ILike(SearchText(), f"%{escaped}%")
    either = Q()
    for name in SEARCH_COLUMNS:
        either |= Q(**{f"{name}__icontains": text})
    return either
