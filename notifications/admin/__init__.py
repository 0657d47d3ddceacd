"""The operations console (Django admin), one module per concern:

* ``outbox`` — the Notification Outbox page, a notification's detail, Retry and Discard;
* ``filters`` — the outbox page's list filters and subject search;
* ``lists`` — notification lists and their email recipients;
* ``channels`` — list targets of Teams, webhooks, SMS and Apprise, and channel configuration;
* ``smtp`` — the SMTP configuration and its "Send test email";
* ``worker`` — django-q2's schedules, limited to the outbox's own tasks.
* ``policies`` — delivery policies and channel health (the circuit breakers).
* ``silences`` — silences and maintenance windows (suppression at ingest);
* ``site`` — the console's name (branding); its favicon and styles are in templates/admin/base_site.html.

Importing the package registers every model admin (Django's autodiscovery imports it).
"""

from notifications.admin import channels, lists, outbox, policies, silences, site, smtp, worker

__all__ = ["channels", "lists", "outbox", "policies", "silences", "site", "smtp", "worker"]
