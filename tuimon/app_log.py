"""Where the full-screen app logs: a file, since the screen is the app's.

Warnings (a node's bad frame, a relay that speaks for what it may not) and internal
errors with their tracebacks go to `$XDG_STATE_HOME/tuimon/tuimon.log` (by default
`~/.local/state/tuimon/tuimon.log`, kept under 2 x 5 MiB) or `--log-file`; the app says
where when something is worth reading there (it asks tuimon_core.logs.current_log_path).
`--once`, `--plain`, `status` and the relay log to standard error as before.
"""

from __future__ import annotations

import logging
import os
from logging.handlers import RotatingFileHandler
from pathlib import Path

from tuimon_core.errors import UsageError
from tuimon_core.logs import CleanFormatter

MAX_LOG_BYTES = 5 << 20


def default_log_path() -> Path:
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "tuimon" / "tuimon.log"


def log_to_file(path: str | None) -> Path | None:
    """Send warnings and errors to the app's log file; returns it, or None when the
    default place cannot be written (a read-only home: the app runs without a log). A
    file the user named that cannot be written is a usage error."""
    target = Path(path) if path else default_log_path()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        handler = RotatingFileHandler(target, maxBytes=MAX_LOG_BYTES, backupCount=1,
                                      encoding="utf-8")
    except OSError as exc:
        if path:
            raise UsageError(f"--log-file {path}: {exc.strerror or exc}") from None
        return None
    handler.setFormatter(CleanFormatter())
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    return target
