"""Migration operations that change the notifications table without a long lock on PostgreSQL.

The table holds millions of rows (a year of history); a deploy must not stop ingest while an
index is built or a constraint checked. On PostgreSQL:

- an index is created and dropped ``CONCURRENTLY`` (reads and writes go on; the migration is
  then non-atomic, as PostgreSQL requires);
- a check constraint is added ``NOT VALID`` (a brief lock, no scan) and then validated
  (a scan that lets reads and writes go on).

SQLite, the embedded default, has neither: there they are the plain operations, which are
quick at the sizes SQLite is meant for.
"""

from typing import Any

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations


def _postgresql(schema_editor: Any) -> bool:
    return schema_editor.connection.vendor == "postgresql"


class AddIndexConcurrentlyWherePossible(AddIndexConcurrently):
    """``AddIndexConcurrently`` on PostgreSQL, ``AddIndex`` elsewhere."""

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        if _postgresql(schema_editor):
            super().database_forwards(app_label, schema_editor, from_state, to_state)
        else:
            migrations.AddIndex.database_forwards(self, app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        if _postgresql(schema_editor):
            super().database_backwards(app_label, schema_editor, from_state, to_state)
        else:
            migrations.AddIndex.database_backwards(self, app_label, schema_editor, from_state, to_state)


class RemoveIndexConcurrentlyWherePossible(RemoveIndexConcurrently):
    """``RemoveIndexConcurrently`` on PostgreSQL, ``RemoveIndex`` elsewhere."""

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        if _postgresql(schema_editor):
            super().database_forwards(app_label, schema_editor, from_state, to_state)
        else:
            migrations.RemoveIndex.database_forwards(self, app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        if _postgresql(schema_editor):
            super().database_backwards(app_label, schema_editor, from_state, to_state)
        else:
            migrations.RemoveIndex.database_backwards(self, app_label, schema_editor, from_state, to_state)


class AddCheckConstraintValidatedLater(migrations.AddConstraint):
    """``AddConstraint`` of a check constraint; on PostgreSQL added ``NOT VALID`` and then
    validated in a statement of its own, so that no lock blocks writers while the rows are
    checked (run it in a non-atomic migration, so that each statement commits)."""

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        if not _postgresql(schema_editor):
            super().database_forwards(app_label, schema_editor, from_state, to_state)
            return
        model = to_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        table = schema_editor.quote_name(model._meta.db_table)
        name = schema_editor.quote_name(self.constraint.name)
        schema_editor.execute(f"{self.constraint.create_sql(model, schema_editor)} NOT VALID")
        schema_editor.execute(f"ALTER TABLE {table} VALIDATE CONSTRAINT {name}")


class AddUniqueConstraintConcurrentlyWherePossible(migrations.AddConstraint):
    """``AddConstraint`` of a partial unique constraint (one with a condition, which PostgreSQL
    keeps as a unique index); on PostgreSQL its index is built ``CONCURRENTLY`` (run it in a
    non-atomic migration)."""

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        if not _postgresql(schema_editor):
            super().database_forwards(app_label, schema_editor, from_state, to_state)
            return
        model = to_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        sql = str(self.constraint.create_sql(model, schema_editor))
        assert sql.startswith("CREATE UNIQUE INDEX "), sql  # a partial unique constraint is an index
        schema_editor.execute(sql.replace("CREATE UNIQUE INDEX ", "CREATE UNIQUE INDEX CONCURRENTLY ", 1))

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        if not _postgresql(schema_editor):
            super().database_backwards(app_label, schema_editor, from_state, to_state)
            return
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {schema_editor.quote_name(self.constraint.name)}")


class ReplaceCheckConstraintNotValid(migrations.AddConstraint):
    """Replace the check constraint of the same name by ``constraint``. On PostgreSQL the old one
    is dropped and the new one added ``NOT VALID`` in the migration's transaction (a brief lock,
    no scan: rows written from then on are checked); :class:`ValidateConstraint` in a later,
    non-atomic migration then checks the existing rows without blocking writers."""

    def state_forwards(self, app_label: str, state: Any) -> None:
        state.remove_constraint(app_label, self.model_name_lower, self.constraint.name)
        super().state_forwards(app_label, state)

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        model = to_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        old_model = from_state.apps.get_model(app_label, self.model_name)
        old = next(c for c in old_model._meta.constraints if c.name == self.constraint.name)
        if not _postgresql(schema_editor):
            schema_editor.remove_constraint(old_model, old)
            schema_editor.add_constraint(model, self.constraint)
            return
        schema_editor.execute(old.remove_sql(old_model, schema_editor))
        schema_editor.execute(f"{self.constraint.create_sql(model, schema_editor)} NOT VALID")

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        model = from_state.apps.get_model(app_label, self.model_name)
        old_model = to_state.apps.get_model(app_label, self.model_name)
        old = next(c for c in old_model._meta.constraints if c.name == self.constraint.name)
        schema_editor.remove_constraint(model, self.constraint)
        schema_editor.add_constraint(old_model, old)

    def describe(self) -> str:
        return f"Replace constraint {self.constraint.name} on model {self.model_name} (not yet validated)"


class ValidateConstraint(migrations.operations.base.Operation):
    """``ALTER TABLE … VALIDATE CONSTRAINT`` on PostgreSQL (a scan that lets reads and writes go
    on); nothing elsewhere. No change to the migration state."""

    reversible = True

    def __init__(self, model_name: str, name: str) -> None:
        self.model_name = model_name
        self.name = name

    def state_forwards(self, app_label: str, state: Any) -> None:
        pass

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        if not _postgresql(schema_editor):
            return
        model = to_state.apps.get_model(app_label, self.model_name)
        table = schema_editor.quote_name(model._meta.db_table)
        schema_editor.execute(f"ALTER TABLE {table} VALIDATE CONSTRAINT {schema_editor.quote_name(self.name)}")

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        pass

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        return self.__class__.__name__, [], {"model_name": self.model_name, "name": self.name}

    def describe(self) -> str:
        return f"Validate constraint {self.name} on model {self.model_name}"
