"""How long a node may be silent: the up / stale / down timings both viewers and relays
apply to what they watch."""

# No frame for this many of the node's sample intervals (at least 5 s): stale.
STALE_AFTER_INTERVALS = 3.0
STALE_AT_LEAST_S = 5.0
# Stale for this long without a frame: down.
DOWN_AFTER = 60.0
