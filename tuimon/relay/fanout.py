"""The relay's middle: the latest state of every upstream node, and what each viewer is
still owed.

Frames from agents arrive one node at a time (the upstream streams' sink is `FanOut`);
viewers get them in batches, at their own interval, restricted to the nodes and families
they subscribed to (what each is owed: tuimon.relay.viewer_feed). Frames are forwarded
as the agent's own bytes unless the viewer asked for fewer families, and each filtered
encoding is made once and shared (tuimon.relay.sample_frame). Beside the frames, the
jobs' steps are counted for the ledger, one source per rank (tuimon.model.step_credit).
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from tuimon.model.attribution import concerning, stop_cause
from tuimon.model.judge_config import JudgeConfig
from tuimon.model.step_credit import JobCredit, JobGrant, StepCredit
from tuimon.relay.judging import RelayJudge
from tuimon.relay.sample_frame import SampleFrame
from tuimon.relay.upstream import Source
from tuimon.relay.viewer_feed import ViewerFeed
from tuimon_core.findings import Finding
from tuimon_core.findings_family import findings_to_wire
from tuimon_core.identity import may_carry
from tuimon_core.node_rules import NodeRules
from tuimon_core.node_states import LOST, SOURCE_STATES, STALE, UP
from tuimon_core.overview import OVERVIEW_FAMILIES, build_overview, hello_port_ids
from tuimon_core.protocol import (
    Event,
    Hello,
    ProtocolError,
    Sample,
    decode,
    encode,
)
from tuimon_core.protocol.families import Frame
from tuimon_core.protocol.fields import MAX_DETAIL
from tuimon_core.timing import aged_state, lost_state

log = logging.getLogger(__name__)
# A node that has not reported a job within this long of the job's last report is no
# longer one of its nodes (the job restarted elsewhere).
JOB_NODES_S = 600.0
# How long the nodes a job ran on are remembered: as long as a stop can last.
JOB_SOURCES_KEEP_S = 86400.0


def _lacks_overview(message: Sample) -> bool:
    """A full sample without an overview: an agent that predates them."""
    if message.keys is not None:
        return "gpus" in message.keys and "overview" not in message.keys
    return message.gpus is not None and "overview" not in message.extra


def _fair_share(lists: list[list[str]], limit: int) -> set[str]:
    """At most `limit` names from several viewers' lists, taken in turns, so that each
    viewer keeps some of what it looks at when together they want more."""
    out: set[str] = set()
    for column in itertools.zip_longest(*lists):
        for name in column:
            if name is not None and len(out) < limit:
                out.add(name)
        if len(out) >= limit:
            break
    return out


@dataclass
class RelayStats:
    frames_in: int = 0
    bad_frames: int = 0
    steps_reports: int = 0


class FanOut:
    """The relay's sink for upstream streams (`tuimon.sources.agent_stream.StreamSink`)
    and the set of viewer feeds."""

    def __init__(self, on_steps: Callable[..., None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time,
                 on_totals: Callable[[str, dict[str, Any], float, JobCredit, JobGrant],
                                     None] | None = None,
                 on_ended: Callable[[str, float], None] | None = None,
                 judge: RelayJudge | None = None) -> None:
        self.sources: dict[str, Source] = {}
        self.viewers: set[ViewerFeed] = set()
        self.on_steps = on_steps
        # (source, a job's entry of its steps family, now): the agent's cumulative sums,
        # from which the ledger recovers what it missed while this relay was away.
        self.on_totals = on_totals
        # (job, when): its ranks said the run is complete.
        self.on_ended = on_ended
        # job -> source -> when it last reported the job (the wall clock, as the ledger's
        # minutes): the job's nodes, kept JOB_SOURCES_KEEP_S (forget_jobs).
        self.job_sources: dict[str, dict[str, float]] = {}
        self.clock = clock
        self.wall = wall
        self.stats = RelayStats()
        # Each (job, rank) counted from one node only, and never more than real time.
        self.credit = StepCredit()
        # job -> the nodes that said their ranks of it are done (StepReporter.finish)
        self._ended_by: dict[str, set[str]] = {}
        # The relay's own judgement of every node it carries (tuimon.relay.judging): its
        # findings are what /metrics, the viewers, the ledger's causes and its episodes
        # read.
        self.judge = judge if judge is not None else RelayJudge(JudgeConfig(), wall, clock)
        self.findings: list[Finding] = []
        # Which target holds each node name: the model's (what it refuses, this drops).
        self.names = self.judge.cluster.names
        self._problems_logged: set[tuple[str, str]] = set()
        self._detail_over = 0  # nodes asked for in detail beyond what an upstream takes

    # -- viewers --------------------------------------------------------------------

    def attach(self, feed: ViewerFeed) -> None:
        self.viewers.add(feed)
        self.refill(feed)

    def detach(self, feed: ViewerFeed) -> None:
        self.viewers.discard(feed)

    def refill(self, feed: ViewerFeed) -> None:
        """Owe a viewer the current picture of every node it wants (on connect and on a
        new subscription), so it does not wait a full interval to see the cluster."""
        feed.hellos.clear()
        feed.samples.clear()
        feed.states.clear()
        for source in self.sources.values():
            if not feed.wants(source):
                continue
            feed.offer_state(source)
            if source.hello is not None:
                feed.offer_hello(source)
            if source.sample is not None and source.state == UP:
                feed.offer_sample(source.name, source.sample)

    def refill_detail(self, feed: ViewerFeed, names: Iterable[str]) -> None:
        """Owe a viewer the latest sample of the nodes it now looks at closely: every
        value if the relay has them, else the overview until the agent sends them."""
        for name in names:
            source = self.sources.get(name)
            if source is not None and source.sample is not None and feed.wants(source):
                feed.offer_sample(name, source.sample)

    def _feeds(self, source: Source) -> Iterable[ViewerFeed]:
        return [f for f in self.viewers if f.nodes is None or f.wants(source)]

    # -- StreamSink -----------------------------------------------------------------

    def add_target(self, target: str) -> Source:
        source = self.sources.get(target)
        if source is None:
            source = self.sources[target] = Source(target)
            for feed in self._feeds(source):
                feed.offer_state(source)
        return source

    def claim(self, source: str, relay: str) -> bool:
        """May upstream `relay` speak for `source`? Not for one of this relay's own
        targets, nor for a node another upstream relay carries."""
        return may_carry(self.sources.get(source), relay, lambda: self.add_target(source))

    def owner_of(self, source: str) -> str | None:
        known = self.sources.get(source)
        return known.owner if known is not None else None

    def note_relay_problem(self, relay: str, key: str, text: str | None) -> None:
        """An upstream relay's problem: logged once (the viewers of this relay see the
        nodes it refused as not declared)."""
        if text is not None and (relay, key) not in self._problems_logged and \
                len(self._problems_logged) < 4096:  # then silent: said often enough
            self._problems_logged.add((relay, key))
            log.warning("%s", text)

    def relay_lost(self, relay: str, sources: set[str] | frozenset[str], reason: str) -> None:
        """An upstream relay is unreachable: its nodes go stale with that reason (the
        wire's states have no "unknown"; this relay's viewers read the reason)."""
        for source in sources:
            self.mark_stale(source, f"relay {relay} unreachable: {reason}")

    def relay_back(self, relay: str) -> None:
        """An upstream relay answers again: its nodes come back with their frames."""

    def forget_relay_problems(self, relay: str) -> None:
        self._problems_logged = {p for p in self._problems_logged if p[0] != relay}

    def forget_target(self, target: str) -> None:
        # An upstream relay is not a node; viewers never heard of it as one.
        self.sources.pop(target, None)
        self.judge.cluster.forget_target(target)
        for feed in self.viewers:
            feed.states.pop(target, None)

    def apply_message(self, target: str, message: Hello | Sample | Event | None,
                      raw: bytes = b"") -> None:
        if message is None:
            return
        source = self.add_target(target)
        # The relay's model takes every frame first: it holds the node names (the one
        # identity rule, tuimon_core.identity) and refuses what a duplicate sends.
        self.judge.cluster.apply_message(target, message)
        if isinstance(message, Hello):
            for refused in self.names.duplicates:
                known = self.sources.get(refused)
                if known is not None and (known.hello is not None or refused == target):
                    self._refuse_name(refused)
        if self.names.refused(target) is not None:
            return  # says a node name another target holds: neither kept nor sent on
        self.stats.frames_in += 1
        source.frames += 1
        source.last_seen = self.clock()
        if source.state != UP:
            self._set_state(source, UP, None)
        if isinstance(message, Sample):
            raw = raw or encode(message)
            added = None
            if _lacks_overview(message):
                try:
                    added = self._upgrade(source, raw)
                except ProtocolError as exc:
                    self.note_protocol_error(target, exc.reason)
                    return
            sample = SampleFrame(message, raw, added=added, port_ids=source.port_ids)
            source.sample = sample
            source.conditions = (added or message.extra).get("findings")
            self._count_steps(target, message)
            for feed in self._feeds(source):
                feed.offer_sample(target, sample)
            return
        frame = Frame(message, raw)
        if isinstance(message, Hello):
            source.hello = frame
            source.node = message.node
            source.port_ids = hello_port_ids(message)
            for feed in self._feeds(source):
                feed.offer_hello(source)
        else:
            for feed in self._feeds(source):
                if feed.wants_events():
                    feed.offer_event(target, frame)

    def _refuse_name(self, target: str) -> None:
        """A target that says a node name another holds (tuimon_core.identity): what it
        sent is dropped, and its viewers told why, under its own address."""
        source = self.sources.get(target)
        if source is None:
            return
        source.hello = source.sample = None
        source.node = source.conditions = source.rules = None
        source.port_ids = []
        self._set_state(source, STALE, self.names.message(target))

    def mark_stale(self, target: str, reason: str) -> None:
        source = self.add_target(target)
        self._set_state(source, lost_state(source.last_seen, self.clock()), reason)
        self.judge.cluster.mark_stale(target, reason)

    def note_protocol_error(self, target: str, reason: str) -> None:
        self.stats.bad_frames += 1
        self.mark_stale(target, f"bad frame: {reason}")

    def apply_source_state(self, source: str, state: str, reason: str | None) -> None:
        # A relay upstream of this one says how its node stands: pass it on.
        self._set_state(self.add_target(source), state, reason)
        self.judge.cluster.apply_source_state(source, state, reason)

    def apply_budget(self, budget: dict[str, dict[str, Any]], source: str = "") -> None:
        """An upstream relay's ledger; this relay keeps its own from the same steps."""

    def apply_judgement(self, judgement: dict[str, Any], relay: str) -> None:
        """An upstream relay's judgement: this relay judges what it sees itself, the
        upstream's nodes among them (its viewers read this relay's)."""

    def refresh(self) -> None:
        """Stale sources become down (tuimon_core.timing), and the relay judges every node
        it carries (its findings); call about once a second."""
        now = self.clock()
        for source in self.sources.values():
            self._set_state(source, aged_state(source.state, source.last_seen, now),
                            source.reason)
        self.findings = self.judge.update()

    # -- what to ask upstream for -----------------------------------------------------

    def upstream_families(self, name: str) -> frozenset[str] | None:
        """The families to ask one agent for (None: all): what the relay needs itself
        (overviews, findings, step sums, events) and what its viewers want of the node.
        A viewer that takes every family of every node (one that predates overviews),
        or looks at this node closely, makes it all."""
        source = self.sources.get(name)
        wanted = set(OVERVIEW_FAMILIES)
        for feed in self.viewers:
            if source is not None and not feed.wants(source):
                continue
            if feed.families is None or name in feed.detail:
                return None
            wanted |= feed.families
        return frozenset(wanted)

    def relay_subscription(self) -> tuple[frozenset[str] | None, frozenset[str]]:
        """The families and the detail to ask an upstream relay for: the union of what
        this relay's viewers ask."""
        families: set[str] | None = set(OVERVIEW_FAMILIES)
        for feed in self.viewers:
            if families is not None:
                if feed.families is None:
                    families = None
                else:
                    families |= feed.families
        detail = _fair_share([sorted(feed.detail) for feed in self.viewers], MAX_DETAIL)
        wanted = len(set().union(*(feed.detail for feed in self.viewers)))
        if wanted > len(detail) and wanted != self._detail_over:
            # An upstream refuses more (and would close the connection): each viewer keeps
            # a share, the rest of its nodes come as overviews until a place frees.
            log.warning("relay: viewers look closely at %d nodes; an upstream relay takes "
                        "%d, the rest come as overviews", wanted, MAX_DETAIL)
        self._detail_over = wanted if wanted > len(detail) else 0
        return (None if families is None else frozenset(families)), frozenset(detail)

    def _upgrade(self, source: Source, raw: bytes) -> dict[str, Any] | None:
        """The overview and findings of an agent that predates them, made here from its
        full sample (decoded and checked: these values are read, not just forwarded)."""
        full = decode(raw)
        if not isinstance(full, Sample) or full.gpus is None:
            return None
        hello = source.hello.message if source.hello is not None else None
        if source.rules is None:
            source.rules = NodeRules(source.node or source.name)
        now = self.clock()
        source.rules.observe(hello, full, now)
        return {"overview": build_overview(hello, full),
                "findings": findings_to_wire(source.rules.conditions(now))}

    # -- internals ------------------------------------------------------------------

    def _set_state(self, source: Source, state: str, reason: str | None) -> None:
        if (source.state, source.reason) == (state, reason):
            return
        source.state, source.reason = state, reason
        for feed in self._feeds(source):
            feed.offer_state(source)

    def _count_steps(self, source: str, sample: Sample) -> None:
        steps = sample.extra.get("steps")
        if not steps or self.on_steps is None:
            return
        self.stats.steps_reports += 1
        # The ledger's minutes are the relay's own (receive time), never the agent's.
        wall_now = self.wall()
        now = self.clock()
        credited = {job.job: job for job in self.credit.credit(source, steps, now)}
        for job in credited.values():
            self.job_sources.setdefault(job.job, {})[source] = wall_now
            # Ledger.add: run seconds, what they waited on, and samples per rank-second.
            self.on_steps(job.job, wall_now, job.total_s, job.effective_s, job.waits_s,
                          float(job.samples), job.wall)
        for entry in steps.get("jobs") or ():
            mine = credited.get(entry["id"])  # only the ranks this source may speak for
            if mine is not None and self.on_totals is not None and \
                    entry.get("total") is not None:
                self.on_totals(source, entry, wall_now, mine,
                               self.credit.grant(mine.job, now))
            # After this sample's last steps: a node that runs the job says its ranks are
            # done; the run is complete once every node it ran on lately has said so.
            if not entry.get("ended"):
                if mine is not None and entry["id"] in self._ended_by:
                    self._ended_by[entry["id"]].discard(source)  # it runs again
            elif self.on_ended is not None and self.credit.held(source, entry["id"]):
                ended = self._ended_by.setdefault(entry["id"], set())
                ended.add(source)
                if ended >= set(self._lately(entry["id"])):
                    del self._ended_by[entry["id"]]
                    self.on_ended(entry["id"], wall_now)

    def _lately(self, job: str, before: float = math.inf) -> dict[str, float]:
        """The sources that reported a job within JOB_NODES_S of its last report (before
        `before`): the nodes it runs on, not those it left after a restart."""
        sources = self.job_sources.get(job, {})
        newest = max((t for t in sources.values() if t < before), default=None)
        if newest is None:
            return {}
        return {s: t for s, t in sources.items() if t >= newest - JOB_NODES_S}

    def job_nodes(self, job: str) -> tuple[set[str], list[str]]:
        """The nodes a job ran on lately, and those of them whose agents are lost now."""
        nodes: set[str] = set()
        lost: list[str] = []
        for name in self._lately(job):
            source = self.sources.get(name)
            if source is None:
                continue
            node = source.node or source.name
            nodes.add(node)
            if source.state in LOST:
                lost.append(node)
        return nodes, lost

    def job_findings(self, job: str) -> list[Finding]:
        """The findings this relay holds that concern a job (on its nodes, or the
        cluster's)."""
        return concerning(self.findings, job, self.job_nodes(job)[0])

    def jobs_touched(self, finding: Finding) -> list[str]:
        """The jobs a finding concerns now: those running on a node it names (or any of
        its nodes), or every job where it names no node (a file system, the spine)."""
        return [job for job in self.job_sources
                if concerning([finding], job, self.job_nodes(job)[0])]

    def stop_cause(self, job: str) -> str:
        """What a job falling silent now is put down to (tuimon.model.attribution)."""
        nodes, lost = self.job_nodes(job)
        return stop_cause(lost, concerning(self.findings, job, nodes))

    def returned(self, job: str, since: float) -> bool:
        """Whether every node the job ran on before `since` (the wall clock) has reported
        it again since: their agents' totals have then said what ran while it seemed
        stopped."""
        before = self._lately(job, since)
        return all(self.job_sources[job][name] >= since for name in before)

    def forget_jobs(self, older_than: float) -> None:
        """Drop the nodes that have not reported a job for `older_than` seconds."""
        now = self.wall()
        for job in list(self.job_sources):
            sources = {s: t for s, t in self.job_sources[job].items() if now - t <= older_than}
            if sources:
                self.job_sources[job] = sources
            else:
                del self.job_sources[job]
                self._ended_by.pop(job, None)

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(SOURCE_STATES, 0)
        for source in self.sources.values():
            out[source.state] = out.get(source.state, 0) + 1
        return out
