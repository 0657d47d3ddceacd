import json
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from notifications.config_file import ConfigFileError, configuration_export, configuration_import


class Command(BaseCommand):
    help = "Import or export the outbox configuration (SMTP, notification lists, sites) as JSON."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True, metavar="{import,export}")
        importer = sub.add_parser("import", help="Upsert the configuration in FILE ('-' for stdin).")
        importer.add_argument("file")
        exporter = sub.add_parser("export", help="Write the configuration (without secrets) to FILE or stdout.")
        exporter.add_argument("file", nargs="?", default="-")

    def handle(self, *args: Any, action: str, file: str, **options: Any) -> None:
        if action == "export":
            text = json.dumps(configuration_export(), indent=2) + "\n"
            if file == "-":
                self.stdout.write(text, ending="")
            else:
                with open(file, "w", encoding="utf-8") as handle:
                    handle.write(text)
                self.stderr.write(f"Wrote configuration to {file}.")
            return

        try:
            if file == "-":
                data = json.load(sys.stdin)
            else:
                with open(file, encoding="utf-8") as handle:
                    data = json.load(handle)
        except FileNotFoundError:
            raise CommandError(f"{file}: no such file.") from None
        except json.JSONDecodeError as exc:
            raise CommandError(f"{file}: not valid JSON ({exc}).") from None
        try:
            summary = configuration_import(data=data)
        except ConfigFileError as exc:
            raise CommandError(
                f"{file}: {len(exc.problems)} problem(s); nothing was changed:\n  " + "\n  ".join(exc.problems)
            ) from None
        self.stdout.write(
            f"Imported {file}: SMTP {summary['smtp'] or 'unchanged'}; "
            f"channels {', '.join(summary['channels']) or 'unchanged'}; "
            f"policies {summary['policies_created']} created, {summary['policies_updated']} updated; "
            f"lists {summary['lists_created']} created, {summary['lists_updated']} updated; "
            f"sites {summary['sites_created']} created, {summary['sites_updated']} updated."
        )
