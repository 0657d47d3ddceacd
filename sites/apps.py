from django.apps import AppConfig


class SitesConfig(AppConfig):
    name = "sites"
    label = "sites"
    verbose_name = "Sites"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from sites import schema  # noqa: F401  (registers the OpenAPI auth extension)
