"""How every tuimon program logs: one line format, and every line through the one
cleaner (tuimon_core.protocol.text), so a node, job or target name from outside cannot
write an escape sequence to a terminal or forge a line in a log file, whichever path
logged it. A message is cleaned whole (its newlines escaped); a traceback, ours, keeps
its lines."""

from __future__ import annotations

import argparse
import logging
from logging.handlers import RotatingFileHandler
from typing import Any

from tuimon_core.protocol.text import clean, clean_lines

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LEVELS = ("debug", "info", "warning", "error")


def add_log_level_option(p: argparse.ArgumentParser, default: str = "info") -> None:
    """`--log-level`, the same four levels for every program that logs to stderr."""
    p.add_argument("--log-level", default=default, choices=LEVELS,
                   help=f"what goes to stderr: {', '.join(LEVELS)} and above "
                        f"(default {default})")


class CleanFormatter(logging.Formatter):
    """FORMAT, with the message and any traceback made printable."""

    def __init__(self) -> None:
        super().__init__(FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        # Another handler may have cached the traceback's text as it came: made anew.
        cached, record.exc_text = record.exc_text, None
        try:
            return super().format(record)
        finally:
            record.exc_text = cached

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = clean(record.message)
        return super().formatMessage(record)

    def formatException(self, ei: Any) -> str:
        text = super().formatException(ei)
        # An exception's own message (where outside text often is) cleaned whole, so
        # its newlines cannot forge a line; the rest line by line.
        seen: set[int] = set()
        exc = ei[1]
        while exc is not None and id(exc) not in seen:
            seen.add(id(exc))
            said = str(exc)
            if said and not said.isprintable():
                text = text.replace(said, clean(said))
            exc = exc.__cause__ or exc.__context__
        return clean_lines(text)

    def formatStack(self, stack_info: str) -> str:
        return clean_lines(super().formatStack(stack_info))


def log_to_stderr(level: str = "warning") -> None:
    """Log at `level` and above to standard error, cleaned (replacing Python's
    last-resort handler, which writes a message as it came)."""
    handler = logging.StreamHandler()
    handler.setFormatter(CleanFormatter())
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, logging.StreamHandler)
                and getattr(h, "stream", None) is handler.stream]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())


def current_log_path() -> str | None:
    """The file the program logs to now, if any (tuimon.app_log's, where the full-screen
    app logs): for a message that points there."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, RotatingFileHandler):
            return handler.baseFilename
    return None
