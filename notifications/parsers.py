"""The API's request parser (a module of its own: DRF reads its settings when its views are
imported, so the parser must not live beside the views)."""

from typing import Any

from rest_framework import exceptions, parsers


class JSONParser(parsers.JSONParser):
    """DRF's JSON parser, and a body nested deeper than the decoder's recursion limit (a few
    KB of ``[[[[…``) is a 400 parse error like any other malformed body, not a 500."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise exceptions.ParseError("JSON parse error - the document is nested too deeply.") from None
