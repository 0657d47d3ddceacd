"""Date formats of the console (English locale): every timestamp with seconds and its zone, so
list pages, detail pages and the history read alike ("2026-11-23 10:16:08 UTC")."""

DATETIME_FORMAT = "Y-m-d H:i:s T"
SHORT_DATETIME_FORMAT = "Y-m-d H:i:s T"
DATE_FORMAT = "Y-m-d"
SHORT_DATE_FORMAT = "Y-m-d"
TIME_FORMAT = "H:i:s"
