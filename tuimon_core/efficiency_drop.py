"""An efficiency drop: a job's SLI over the last minute against the hour before it,
judged where the step sums are counted and held until the job is back.

The agent judges each job over its own ranks (synchronous training slows every rank
together, so each node sees the drop the job has) and sends the verdict with its step
sums; a viewer takes the nodes' verdict, so one that connects during a drop shows it
with the SLI the job dropped from, as one that watched it happen does. For sources that
do not judge (older agents, Prometheus) the viewer runs the same judge over what it
saw. docs/definitions.md says what the SLI is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SHORT_S = 60.0  # the last minute
LONG_S = 3600.0  # against the hour before it
# The burn page's short window (tuimon.model.slo, `5m`): the nodes send their sums over it
# too, so a reader that connects now can judge the page as one that watched.
BURN_SHORT_S = 300.0
MIN_BEFORE_S = 60.0  # the hour before must hold at least this much to compare with
DROP_POINTS = 0.10  # the last minute this far below the hour before: a drop
RECOVER_POINTS = 0.03  # a drop ends once the last minute is back within this of where it was


@dataclass(frozen=True, slots=True)
class Drop:
    """A drop that holds: the SLI the job had before it, and when it was first judged
    (Unix time)."""

    from_sli: float
    since: float


class DropJudge:
    """One job's drop, held from the minute it is judged until the job is back."""

    __slots__ = ("drop",)

    def __init__(self) -> None:
        self.drop: Drop | None = None

    def update(self, short: float | None, before: float | None, now: float) -> Drop | None:
        """`short`: the SLI of the last minute; `before`: of the hour before it (None
        while too little is known); `now`: Unix time."""
        if self.drop is None:
            if short is not None and before is not None and before - short >= DROP_POINTS:
                self.drop = Drop(before, now)
        elif short is not None and short >= self.drop.from_sli - RECOVER_POINTS:
            self.drop = None
        return self.drop


def judge_windows(judge: DropJudge, short: Mapping[str, Any], long: Mapping[str, Any],
                  now: float) -> dict[str, float] | None:
    """A node's verdict from its windows as it sends them (`covered`, `wall`, `compute`
    of the last minute and of the last hour): the last minute against the hour before
    it; the `drop` a node's steps carry, or None. The agent judges its own ranks so, and
    `tuimon prom` each node's from its counters, with one DropJudge a node and job."""
    sli = short["compute"] / short["wall"] if short["wall"] > 0 else None
    wall = long["wall"] - short["wall"]
    before = ((long["compute"] - short["compute"]) / wall
              if wall > 0 and long["covered"] - short["covered"] >= MIN_BEFORE_S else None)
    drop = judge.update(sli, before, now)
    # How long ago, not when: a reader's clock need not agree with this node's.
    return None if drop is None else {"from": drop.from_sli,
                                      "held": min(86400.0, round(now - drop.since, 1))}
