"""One refresh's answers -> the frames of the nodes they name, with no server and no
model: the inventory's answers taken up, the nodes assembled (prom_assembly), their
port errors counted, each changed node's hello and sample made (prom_frames), the
budget read. What `tuimon prom`'s scheduler and the headless judge over Prometheus
deliver, and what the tests on recorded answers read."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from tuimon.model.slo import DEFAULT_HOURS
from tuimon.sources import prom_queries as q
from tuimon.sources.prom_answers import Series
from tuimon.sources.prom_assembly import Assembler, Node
from tuimon.sources.prom_frames import FrameMaker, budget
from tuimon.sources.prom_inventory import Inventory
from tuimon.sources.prom_nodes import NodeNames
from tuimon_core.protocol import Hello, Sample
from tuimon_core.protocol.text import clean

log = logging.getLogger("tuimon.sources.prometheus")


@dataclass
class Read:
    """What one refresh's answers say."""

    nodes: dict[str, Node]  # every node they name (at most MAX_NODES)
    frames: list[tuple[str, Hello | Sample]] = field(default_factory=list)
    current: list[str] = field(default_factory=list)  # nodes as they were last sent
    broken: dict[str, str] = field(default_factory=dict)  # node -> why its frames failed
    over: set[str] = field(default_factory=set)  # nodes left out past MAX_NODES
    budget: dict[str, dict[str, Any]] | None = None  # where the budget's were answered

    @property
    def jobs(self) -> bool:
        return any(n.jobs for n in self.nodes.values())


class AnswerReader:
    """Holds what the reading needs from one refresh to the next (the assembler's, the
    frames' and the inventory's state); `clock` arguments are monotonic seconds, `ts`
    Unix time."""

    def __init__(self, *, every: float = 5.0, budget_every: float = 30.0,
                 errors_every: float | None = 15.0, node_labels: Collection[str] = (),
                 node_aliases: dict[str, str] | None = None,
                 slo_hours: float = DEFAULT_HOURS) -> None:
        self.assembler = Assembler(errors_every)
        self.frames = FrameMaker(every, budget_every)
        self.inventory = Inventory()
        self.node_labels = list(node_labels)
        self.node_aliases = dict(node_aliases or {})
        self.slo_hours = slo_hours

    def resolver(self, answers: dict[str, Series]) -> NodeNames:
        """The node names these answers' labels resolve to (node_exporter's uname
        learnt)."""
        resolver = NodeNames(self.node_labels, self.node_aliases)
        resolver.learn_uname(answers.get("uname", []))
        return resolver

    def read(self, answers: dict[str, Series], resolver: NodeNames, *, clock: float,
             ts: float, gap: float, failed: Collection[str] = frozenset(),
             known: Collection[str] = (), detail: Collection[str] = frozenset(),
             dense: frozenset[str] = q.DENSE_GPU,
             held: Callable[[str], bool] = lambda _name: False,
             inventory_at: float | None = None, records_age: float = 0.0,
             with_budget: bool = False) -> Read:
        """`failed`: the optional queries that did not answer (their last answers kept);
        `known`: the nodes the viewer has (kept first past MAX_NODES); `detail`: those
        whose screen is open; `dense`: the GPU fields asked of every GPU; `held(node)`:
        does the viewer hold its whole latest sample (else it is sent even unchanged);
        `gap`: the seconds since the refresh before (what the jobs' rates are summed
        over); `inventory_at`: when the whole inventory these answers hold was asked
        (None: not this refresh); `records_age`: how old the totals' records may be."""
        asked = [n for n in q.INVENTORY_QUERIES if n in answers or n in failed]
        self.inventory.take(asked, answers, failed)
        if "gpu_info" in asked and "gpu_info" not in failed:
            self.assembler.matchers = {}  # learnt again from this inventory
        made = self.assembler.assemble(answers, resolver, clock=clock,
                                       kept=self.inventory.kept(resolver), known=known,
                                       detail=detail, dense=dense)
        nodes = made.nodes
        if made.hours is not None:
            self.frames.set_hours(made.hours, clock)
        self.assembler.count_port_errors(nodes, clock)
        self.assembler.keep_matchers(nodes)
        self.inventory.note_lacking(nodes.values(), clock, inventory_at, records_age)
        read = Read(nodes, over=made.over)
        if with_budget:
            read.budget = budget(answers, self.slo_hours)
        # A job's world is not a label: the highest rank seen on any node stands for it.
        worlds: dict[str, int] = {}
        for node in nodes.values():
            for job, ranks in node.jobs.items():
                worlds[job] = max(worlds.get(job, 0), max(ranks) + 1)
        frames = self.frames
        for name, node in nodes.items():
            if frames.unchanged(name, node, held(name)):
                read.current.append(name)
                continue
            try:  # one node's series, alone: a value no check foresaw is that node's
                read.frames += [(name, f) for f in frames.frames(name, node, ts, worlds, gap,
                                                                 clock)]
            except Exception as exc:
                log.error("the series of %s failed", name, exc_info=exc)
                read.broken[name] = clean(f"internal error: {type(exc).__name__}: "
                                          f"{exc}")[:200]
        frames.keep_only(nodes)
        return read
