"""How long a node may be silent: the up / stale / down timings both viewers and relays
apply to what they watch (the states' names: tuimon_core/node_states.py)."""

from tuimon_core.node_states import DOWN, STALE

# No frame for this many of the node's sample intervals (at least 5 s): stale.
STALE_AFTER_INTERVALS = 3.0
STALE_AT_LEAST_S = 5.0
# Stale for this long without a frame: down.
DOWN_AFTER = 60.0
# A job none of whose ranks reported a step for this long (or for several times the
# longest gap between its reports lately) has stopped: its time is lost (`stopped`).
JOB_STOPPED_AFTER_S = 60.0


def lost_state(last_seen: float | None, now: float) -> str:
    """The state of a node that just stopped answering: stale while its last frame is
    recent, down when it is older than DOWN_AFTER or there never was one."""
    return STALE if last_seen is not None and now - last_seen <= DOWN_AFTER else DOWN


def aged_state(state: str, last_seen: float | None, now: float) -> str:
    """Once a second: a stale node goes down when its last frame gets too old."""
    return lost_state(last_seen, now) if state == STALE else state
