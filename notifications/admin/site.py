"""The console's name: "Outbox" in the header, the browser tab and the dashboard's title; and its
login form (notifications/console_login.py: lockouts, throttling, bounded password checks)."""

from django.contrib import admin

from notifications.console_login import ConsoleLoginForm

admin.site.site_header = "Outbox"
admin.site.site_title = "Outbox"
admin.site.index_title = "Operations console"
admin.site.login_form = ConsoleLoginForm
