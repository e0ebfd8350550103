"""The one error the decoder raises."""

from __future__ import annotations

from tuimon_core.protocol.text import clean


class ProtocolError(ValueError):
    """A message that is not valid protocol v1: too large, not msgpack, or wrong shape.

    `reason` says what was wrong and where (e.g. ``sample.gpus[3].temp: expected a
    number, got str``), so a viewer can show it next to the node that sent it.
    """

    def __init__(self, reason: str) -> None:
        # Reasons quote keys and values from the peer: shown and logged, so cleaned.
        reason = clean(reason)
        super().__init__(reason)
        self.reason = reason

    def under(self, where: str) -> ProtocolError:
        """The same error one level up: a container's checks pass "" as the path of
        what they hold (building paths costs on every frame) and add their own here."""
        return type(self)(where + self.reason)
