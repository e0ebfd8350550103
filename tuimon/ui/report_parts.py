"""A run's report (tuimon.model.run_report) as sections of words and tables, the same in
every format: the Markdown and HTML renderers lay them out, escape them for their format
(nothing here is escaped for any) and draw the plots their format can. No Textual."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from tuimon.model.run_report import RunReport
from tuimon_core.wait_kinds import missed_text
from tuimon_core.wording import duration_text, hours_text


@dataclass(frozen=True)
class Table:
    header: tuple[str, ...]
    rows: Sequence[tuple[str, ...]]
    right: frozenset[int] = frozenset()  # columns of numbers, aligned right


@dataclass(frozen=True)
class Section:
    title: str
    text: tuple[str, ...] = ()
    table: Table | None = None
    plot: str | None = None  # drawn after the text where the format can: sli, burn, causes


def when_text(ts: float, seconds: bool = False) -> str:
    """A time in a document people read in several time zones: UTC, said so."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC" if seconds else "%Y-%m-%d %H:%M UTC",
                         time.gmtime(ts))


def period_text(seconds: float) -> str:
    return f"{seconds / 3600:g} h" if seconds >= 3600 else f"{seconds / 60:g} min"


def _with(section: Section) -> Section:
    """A section whose table has no rows says so instead."""
    if section.table is not None and not section.table.rows:
        return Section(section.title, (*section.text, "None."), None, section.plot)
    return section


def _summary(r: RunReport) -> Section:
    text = [f"Job {r.job} through relay {r.relay or '-'}, generated {when_text(r.generated_at)}."
            f" The SLI and the incidents cover {when_text(r.start)} to {when_text(r.until)};"
            f" the budget is the run's, over the ledger's "
            f"{r.budget.window_h or r.slo.window_hours:g} h window, as tuimon status --job "
            "shows it."]
    if r.job_nodes:
        text.append(f"Its nodes: {r.job_nodes}.")
    if r.nodes_lost:
        text.append(f"Lost now: {', '.join(r.nodes_lost)}.")
    if r.stopped is not None:
        since, cause = r.stopped
        text.append(f"STOPPED: no step from any rank since {when_text(since)} "
                    f"({duration_text(r.generated_at - since)}): {cause}.")
    return Section("Summary", tuple(text))


def _sli(r: RunReport) -> Section:
    if r.sli_over is None:
        return Section("SLI over the run", ("No run time counted in this range.",))
    hours = sum(p.hours for p in r.sli)
    return Section("SLI over the run", (
        f"SLI {r.sli_over:.2f} over {hours_text(hours)} of run time (effective over total "
        f"training time), by periods of {period_text(r.sli_every_s)}; the SLO's target is "
        f"{r.slo.target:.2f}.",), plot="sli")


def _budget(r: RunReport) -> Section:
    b = r.budget
    text = [f"{b.left_hours:.1f} of {b.hours:.0f} h left (run), {hours_text(b.consumed_hours)} "
            f"spent; burn {b.burn}."]
    if b.recovered_hours:
        text.append(f"Of the run time, {missed_text(b.recovered_hours, b.recovered_spent_hours)}.")
    table = Table(("Kind", "Spent", "Share", "What it is"),
                  [(s.kind, hours_text(s.hours), f"{s.share:.0%}", s.what) for s in r.spent],
                  frozenset({1, 2}))
    return _with(Section("Error budget: spent by kind", tuple(text), table,
                         "burn" if r.burn_down else None))


def _causes(r: RunReport) -> Section:
    table = Table(("Kind", "Put down to", "Spent", "Share of the kind"),
                  [(c.kind, c.cause, hours_text(c.hours), f"{c.share:.0%}") for c in r.causes],
                  frozenset({2, 3}))
    return _with(Section("Error budget: spent by cause", (
        "What the relay's ledger put each kind's lost time down to over the run: the "
        "findings that held on the job's nodes, shared by their score; no finding where "
        "none explained it.",), table, "causes"))


def _incidents(r: RunReport) -> Section:
    rows = []
    for i in r.incidents:
        held = duration_text((i.ended if i.ended is not None else r.until) - i.onset)
        if i.ended is None:
            held += ", holds"
        rows.append((when_text(i.onset, seconds=True), held,
                     i.severity, f"{i.kind.replace('_', ' ')} {i.where}", i.nodes or "-",
                     hours_text(i.lost_h), str(i.flaps) if i.flaps else "-", i.message))
    table = Table(("Onset", "Duration", "Severity", "Incident", "Components", "Budget cost",
                   "Came back", "What it said"), rows, frozenset({5, 6}))
    return _with(Section("Incidents", (
        f"{len(rows)} incident{'s' if len(rows) != 1 else ''} the relay's judgement held on "
        "the job's nodes in the range, newest first. The cost is the budget the jobs each "
        "touched lost while it held, as the ledger put it down to it.",),
        table))


def _nodes(r: RunReport) -> Section:
    rows = []
    for n in r.nodes:
        slow = "-"
        if n.straggler is not None:
            gpu = f" GPU {n.straggler_gpu}" if n.straggler_gpu is not None else ""
            rank = f"rank {n.straggler_rank}{gpu}: " if n.straggler_rank is not None else ""
            ratio = f"x{n.straggler_ratio:.2f} the median" if n.straggler_ratio else "slow"
            slow = rank + ratio
        rows.append((n.node, hours_text(n.lost_h), f"{n.share:.0%}", slow,
                     ", ".join(n.causes) or "-"))
    table = Table(("Node", "Budget put down to it", "Share of spent", "Straggler now",
                   "Causes"), rows, frozenset({1, 2}))
    return _with(Section("Slowest nodes", (
        "Per node, the job's spent budget the ledger put down to findings on that node over "
        "the run (each cause placed on the node its incident was on, or the node a stop was "
        "put down to), and a rank on it that computes slower than its peers now (the "
        "relay's straggler finding, with its compute time over their median).",),
        table))


def _leaves(r: RunReport) -> Section:
    rows = [(leaf.leaf, ", ".join(f"#{i}" for i in leaf.incidents) or "-",
             hours_text(leaf.lost_h), "; ".join(leaf.now) or "-") for leaf in r.leaves]
    table = Table(("Leaf", "Incidents", "Their cost", "Congestion found now"), rows,
                  frozenset({2}))
    return _with(Section("Leaves", (
        "The leaf switches (and the spine) the incidents in the range named, with what "
        "they cost, and the congestion the relay finds under them now.",),
        table))


def _fleet(r: RunReport) -> Section:
    rows = [(f.aspect, f.nodes or "-", f.job_nodes or "-", f.message) for f in r.fleet]
    table = Table(("Aspect", "Nodes that differ", "Of the job's", "What differs"), rows)
    return _with(Section("Fleet differences now", (
        "Where nodes differ from most of the fleet (driver, firmware, kernel, links, port "
        "rate): not faults, but the first place to look when one of them is the slow one.",),
        table))


def sections(r: RunReport) -> list[Section]:
    """The report's sections, in the order a review reads them."""
    return [_summary(r), _sli(r), _budget(r), _causes(r), _incidents(r), _nodes(r),
            _leaves(r), _fleet(r)]
