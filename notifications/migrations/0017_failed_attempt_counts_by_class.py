"""The failed-attempt counts (0014) gain the failure class, so the KPIs count the failures of
the last interval by class from whole hours of counts and at most half an hour of attempts
(notifications.counts.failures_since).

On PostgreSQL the attempts' triggers are replaced and every failed attempt is counted again
while writers of attempts are held off (about 8 s at 10,000,000 attempts on a 2-core
machine); SQLite keeps no counts.
"""

from django.db import migrations, models

from notifications.counts import failed_attempts_install


def by_class(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        failed_attempts_install(schema_editor, by_class=True)


def without_class(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        failed_attempts_install(schema_editor, by_class=False)


class Migration(migrations.Migration):
    dependencies = [("notifications", "0016_search_index_by_day")]
    operations = [
        migrations.AddField(
            model_name="failedattemptcount",
            name="failure_class",
            field=models.CharField(db_default="", default="", max_length=32),
        ),
        migrations.RunPython(by_class, without_class),
    ]
