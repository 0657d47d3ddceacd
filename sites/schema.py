"""OpenAPI description of the site-key authentication (imported by SitesConfig.ready)."""

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class SiteKeyAuthenticationScheme(OpenApiAuthenticationExtension):
    target_class = "sites.authentication.SiteKeyAuthentication"
    name = "SiteApiKey"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": "`Api-Key <key>` — the key issued for the site (create_site_key).",
        }


class StaffKeyAuthenticationScheme(OpenApiAuthenticationExtension):
    target_class = "sites.authentication.StaffKeyAuthentication"
    # The name the schema gave staff tokens before they became staff keys.
    name = "tokenAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": "`Token <key>` — a staff user's key (create_staff_key, or Staff API keys in the console).",
        }
