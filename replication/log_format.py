"""How a node's log lines look on stderr: ``logging.format`` = text (default) or json.

text: ``2026-11-26 02:40:01,123 WARNING replication.controller.controller: isr_shrink
topic=events partition=0 ...``, for people. json: one object per line, for log pipelines
(Loki, Elasticsearch, ``jq``): ``time`` (ISO 8601, UTC), ``level``, ``logger``, ``message``,
and for an event (:mod:`replication.events`) ``event`` and every field as a key; an
exception's traceback is in ``exc_info``.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

from logstore.errors import ConfigError

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record, with an event's fields as keys."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        name = getattr(record, "event", None)
        if name is not None:
            doc["event"] = name
            for key in getattr(record, "event_fields", ()):
                doc[key] = getattr(record, key)
        if record.exc_info:
            doc["exc_info"] = self.formatException(record.exc_info)
        if record.stack_info:
            doc["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(doc, default=str)


def configure_logging(level: str = "INFO", log_format: str = "text") -> None:
    """Send every log record at ``level`` or above to stderr, as ``log_format`` says."""
    if log_format not in FORMATS:
        raise ConfigError(
            f"config logging.format={log_format!r}: use text (lines for people) or json (one "
            "JSON object per line)"
        )
    handler = logging.StreamHandler(sys.stderr)
    json_lines = log_format == "json"
    handler.setFormatter(JsonFormatter() if json_lines else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler])
