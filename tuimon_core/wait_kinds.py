"""What a training step waits on, as its ranks report it: the one list of wait kinds.

A step's wall time is compute plus waiting; the waiting is split by kind so that the
error budget a job loses can be put down to what it waited on (the network's
collectives, the input pipeline, checkpoints). The reporter (agent.reporter), the agent's
sums, the wire and the viewer all take the kinds from here. A kind a reader does not
know (a newer reporter's) counts as `other`, as does waiting the reporter did not name.

Standard library only: the step reporter, imported by training scripts, uses it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from tuimon_core.wording import hours_text

OTHER = "other"
# Not a rank's to report: the relay's ledger counts it for a job whose ranks all fell
# silent (a crash, a restart, a lost node), from the last report to the next.
STOPPED = "stopped"
# What a training rank reports waiting on (StepReporter.waiting).
RANK_WORDS: dict[str, str] = {
    "comm": "communication (collectives)",
    "data": "input pipeline",
    "checkpoint": "checkpoints",
    OTHER: "other waiting",
}
RANK_KINDS: tuple[str, ...] = tuple(RANK_WORDS)
# What a job's lost time is put down to, in the order they are shown.
WAIT_WORDS: dict[str, str] = {**{k: v for k, v in RANK_WORDS.items() if k != OTHER},
                              STOPPED: "no steps at all (the job's ranks fell silent)",
                              OTHER: RANK_WORDS[OTHER]}
WAIT_KINDS: tuple[str, ...] = tuple(WAIT_WORDS)


def wait_kind(name: object) -> str:
    """The kind a name counts as in a job's lost time."""
    return name if isinstance(name, str) and name in WAIT_WORDS else OTHER


def rank_kind(name: object) -> str:
    """The kind a rank's report counts as (a rank cannot report `stopped`)."""
    return name if isinstance(name, str) and name in RANK_WORDS else OTHER


def split_wait(waits: Mapping[str, float] | None, waited: float,
               reported: float = 0.0, kind: Callable[[object], str] = wait_kind
               ) -> dict[str, float]:
    """`waited` seconds (what was credited) split in the shares the report gave: of
    `reported` seconds of waiting (or of the named waits, if longer), each kind its part;
    kinds a reader does not know, and the part no kind names, go to `other`."""
    out: dict[str, float] = {}
    if waited <= 0:
        return out
    named = 0.0
    for name, seconds in (waits or {}).items():
        if seconds > 0:
            k = kind(name)
            out[k] = out.get(k, 0.0) + seconds
            named += seconds
    whole = max(named, reported, waited if not reported else 0.0)
    if whole > 0 and whole != waited:
        out = {k: v * waited / whole for k, v in out.items()}
    rest = waited - sum(out.values())
    if rest > 1e-9 * max(1.0, waited):  # not float dust of the sums
        out[OTHER] = out.get(OTHER, 0.0) + rest
    return out


def add_waits(into: dict[str, float], waits: Mapping[str, float] | None,
              kind: Callable[[object], str] = wait_kind) -> None:
    """Sum `waits` into `into`, kind by kind (kinds folded as `kind` says)."""
    for name, seconds in (waits or {}).items():
        if seconds > 0:
            k = kind(name)
            into[k] = into.get(k, 0.0) + seconds


def said(shares: Mapping[str, float]) -> str:
    """Shares of the step time by kind, as every view says them: `comm 12%, data 3%`,
    in WAIT_KINDS's order, kinds under half a percent left out."""
    return ", ".join(f"{kind} {shares[kind]:.0%}" for kind in WAIT_KINDS
                     if shares.get(kind, 0.0) >= 0.005)


def said_hours(hours: Mapping[str, float]) -> str:
    """Budget hours by kind, the largest first: `comm 41.0 h, data 12 min`; kinds under
    a minute left out."""
    shown = sorted(((v, k) for k, v in hours.items() if v >= 1 / 60), reverse=True)
    return ", ".join(f"{k} {hours_text(v)}" for v, k in shown)


def missed_text(recovered_h: float, lost_h: Mapping[str, float] | None) -> str:
    """The run time a relay missed and recovered from the agents' totals, with how its
    loss was booked: `2 min the relay missed, counted from the agents' totals; its loss
    booked as the ranks reported it: comm 100%`, or as `other` where they named no kind."""
    text = f"{hours_text(recovered_h)} the relay missed, counted from the agents' totals"
    lost = {k: v for k, v in (lost_h or {}).items() if v > 0}
    whole = sum(lost.values())
    if not whole:
        return text
    if set(lost) == {OTHER}:
        return text + f"; its loss ({hours_text(whole)}) booked as {OTHER}: the totals name no kind"
    return text + (f"; its loss ({hours_text(whole)}) booked as the ranks reported it: "
                   + said({k: v / whole for k, v in lost.items()}))
