"""The garbage collector's settings for processes that hold thousands of nodes.

A viewer or relay of 4096 nodes replaces every node's sample each second: hundreds of
thousands of container objects a second, nearly all freed by reference counting alone.
With the collector's defaults each 700 net allocations start a young collection, and
survivors pile into the old generation until full collections walk everything the
process holds, many times a second: measured, that was half of a relay's CPU at 4096
agents (bench/relay.py: 37 % -> 19 % of a core). Cycles are still collected, just not
so eagerly; memory stayed the same or lower.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

# Young collections after this many net allocations (default 700); older generations
# after this many younger collections (default 10 each). A young collection walks every
# node's newest frame (~50k containers at 4096 nodes, ~30 ms) and finds almost no
# garbage: at 20,000 the app at 4096 nodes ran one a second, 2.7 % of a core, and one in
# thirty s at 100,000 (bench/tui.py, relay, counted with gc.callbacks).
THRESHOLDS = (100_000, 20, 20)


def settle() -> None:
    """Call once the process's long-lived objects exist (widgets, streams, sessions):
    they are moved out of the collector's sight, and the thresholds raised."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """No collection inside the block: for a burst that builds a large, short-lived,
    acyclic structure (a refresh's answers from Prometheus, parsed and turned into
    frames), freed by reference counting at its end. Collections inside it would walk
    the whole structure again and again and find nothing (measured: 7 % of a refresh at
    1024 nodes); after it, the objects kept are few and the next collection is cheap.
    Cycles made meanwhile are collected after."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
