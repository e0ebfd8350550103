"""A node's states, by name: the one set viewers and relays keep, and a relay's batch
says of its sources (the wire's `sources`). How long a node may be silent before it is
stale, then down, is tuimon_core/timing.py's."""

from __future__ import annotations

CONNECTING = "connecting"  # not heard from yet
UP = "up"  # frames arrive
STALE = "stale"  # silent for a few of its intervals
DOWN = "down"  # silent DOWN_AFTER, or never heard from and given up on
# The viewer's own: the relay that carries the node is unreachable, so nothing is known
# of the node itself (never on the wire).
UNKNOWN = "unknown"

# What a relay says of each source it carries.
SOURCE_STATES: tuple[str, ...] = (CONNECTING, UP, STALE, DOWN)
# A viewer's node: the source states and its own UNKNOWN, in the order counts list them.
STATES: tuple[str, ...] = (UP, STALE, DOWN, UNKNOWN, CONNECTING)
# The viewer or the relay stopped hearing from it (stale, then down).
LOST = frozenset({STALE, DOWN})
