from django.apps import AppConfig


class SitesConfig(AppConfig):
    name = "sites"
    label = "sites"
    verbose_name = "Sites"
    default_auto_field = "django.db.models.BigAutoField"
