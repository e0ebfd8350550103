"""Parts of the periodic work that fail alone: a bug in one rule, pane or view is logged
with its traceback, shown as an internal error finding, and the rest goes on.

The app and `tuimon status` run the judgement (and the app its panes) once a second
for hours: an exception that escaped a timer would end the program at the moment its
user needs it most, over data it never chose. Each part runs through `Guard.run`; while
a part keeps failing its finding stands (with the error's text), and it clears the
first time the part runs through again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from tuimon_core.findings import Finding
from tuimon_core.protocol.text import clean

log = logging.getLogger(__name__)

T = TypeVar("T")
D = TypeVar("D")


class Guard:
    """Runs named parts; remembers which are failing and why."""

    def __init__(self) -> None:
        self.errors: dict[str, str] = {}
        self.failures = 0  # parts that raised, in all (a count that never goes back)
        self._ran: set[str] | None = None

    def begin(self) -> None:
        """A pass starts: a part that does not run in it (a node gone, a screen closed)
        has no error standing after `end()`."""
        self._ran = set()

    def end(self) -> None:
        if self._ran is not None:
            for part in self.errors.keys() - self._ran:
                del self.errors[part]
        self._ran = None

    def run(self, part: str, fn: Callable[[], T], default: D) -> T | D:
        """`fn()`, or `default` when it raises (logged once per distinct error)."""
        if self._ran is not None:
            self._ran.add(part)
        try:
            result = fn()
        except Exception as exc:
            self.failures += 1
            text = clean(f"{type(exc).__name__}: {exc}")[:200]
            if self.errors.get(part) != text:
                log.error("internal error in %s (the rest goes on)", part, exc_info=True)
            self.errors[part] = text
            return default
        if self.errors:
            self.errors.pop(part, None)
        return result

    def findings(self) -> list[Finding]:
        """One finding per failing part, in words: what failed and where to look."""
        return [Finding("warning", "internal_error",
                        f"internal error in {part}: {text} (a bug: the log has the "
                        "traceback; everything else keeps updating)", target=part)
                for part, text in sorted(self.errors.items())]
