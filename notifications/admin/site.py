"""The console's name: "Outbox" in the header, the browser tab and the dashboard's title."""

from django.contrib import admin

admin.site.site_header = "Outbox"
admin.site.site_title = "Outbox"
admin.site.index_title = "Operations console"
