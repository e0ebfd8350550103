"""A Prometheus-compatible server (Prometheus, Thanos, Mimir, VictoriaMetrics: anything
with `/api/v1/query`) as a source of the live cluster, for sites with no agent of ours.

Each refresh runs the fixed set of instant queries in `prom_queries` (a few at a time,
with a timeout each), whatever the node count, and turns the answers into the same
`hello` and `sample` frames an agent sends: the app, recordings, diagnosis and
`tuimon status` work unchanged. Frames are encoded and decoded like an agent's, so a
value Prometheus holds that the protocol refuses (NaN, a negative count) is dropped by
the same checks. A node whose series vanish is stale; Prometheus unreachable makes every
node stale with the reason. The error budget comes from the job counters over the SLO
window, as the relay's ledger would send it.

This module is the scheduler: when each query is asked (every refresh, beside the
refreshes, or not at all while --recorded records stand) and where the frames go (a
`PromSink`). The pieces it drives hold the rest: the HTTP client (prom_client), the
inventory (prom_inventory), answers -> nodes (prom_assembly, with prom_port_errors) and
nodes -> frames (prom_frames), the last two pure and tested on recorded answers alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import math
import ssl
import time
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp

from tuimon.model.slo import DEFAULT_HOURS
from tuimon.sources import prom_assembly
from tuimon.sources import prom_live_rules as live_rules
from tuimon.sources import prom_queries as q
from tuimon.sources.prom_answers import Series
from tuimon.sources.prom_client import PromClient, PromError, all_or_none
from tuimon.sources.prom_nodes import NodeNames, identity_labels
from tuimon.sources.prom_reading import AnswerReader
from tuimon.sources.prom_records import RecordReading
from tuimon_core import heap
from tuimon_core.protocol import (
    Batch,
    Event,
    Hello,
    ProtocolError,
    Sample,
    Subscribe,
    decode,
    encode,
)
from tuimon_core.protocol.text import clean

__all__ = ["PromError", "PromOptions", "PromSink", "PromSource", "prom_watching"]

log = logging.getLogger(__name__)

# The soonest the inventory runs again when a GPU lacks what it gives (a node new since).
INVENTORY_SOONEST_S = 15.0


class PromSink(Protocol):
    """Where a Prometheus source delivers: `ClusterState` in the app, `status` and the
    headless judge. Beyond an agent stream's frames, a source that reads the whole
    cluster at once asks what the view wants (the fields drawn, the nodes looked at
    closely, told when they change), says when a whole read is applied and which nodes
    are as they were, and speaks for itself: lost and back, the failed scrapes, the
    fields it did not ask, what it left out at a bound."""

    detail_targets: frozenset[str]
    drawn: frozenset[str] | None

    def add_wants_listener(self, listener: Callable[[], None]) -> None: ...
    def remove_wants_listener(self, listener: Callable[[], None]) -> None: ...
    def apply_message(self, target: str, message: Hello | Sample | Event | None,
                      raw: bytes = b"") -> None: ...
    def note_protocol_error(self, target: str, reason: str) -> None: ...
    def mark_stale(self, target: str, reason: str) -> None: ...
    def mark_current(self, targets: list[str]) -> None: ...
    def known_targets(self) -> Collection[str]: ...
    def holds_sample(self, target: str) -> bool: ...
    def up_targets(self) -> list[str]: ...
    def set_scrape_failures(self, failures: dict[str, tuple[str, str]]) -> None: ...
    def set_unasked(self, fields: frozenset[str]) -> None: ...
    def read_applied(self) -> None: ...
    def apply_budget(self, budget: dict[str, dict[str, Any]], source: str = "") -> None: ...
    def source_lost(self, source: str, reason: str) -> None: ...
    def source_back(self, source: str) -> None: ...
    def source_is_lost(self, source: str) -> bool: ...
    def note_source_limit(self, source: str, text: str | None) -> None: ...


@dataclass
class PromOptions:
    token: str | None = None
    # A multi-tenant store's tenant (Mimir, Cortex): sent as X-Scope-OrgID.
    tenant: str | None = None
    ssl_context: ssl.SSLContext | None = None
    # Extra label matchers added to every selector, e.g. 'cluster="prod"'.
    match: str = ""
    every: float = 5.0
    budget_every: float = 30.0
    slo_hours: float = DEFAULT_HOURS
    timeout: float = 10.0
    concurrency: int = 4
    recorder: Callable[[str, bytes], None] | None = None
    # Node identity (tuimon.sources.prom_nodes): labels tried first, and renames.
    node_labels: list[str] = field(default_factory=list)
    node_aliases: dict[str, str] = field(default_factory=dict)
    # Select the records of `tuimon rules --live` instead of evaluating the queries they
    # record (prom_live_rules).
    recorded: bool = False
    # Seconds between two reads of the ports' error counters, which count what grew
    # between reads (at thousands of nodes the costliest query of a refresh; a scrape
    # every 15 s or more has nothing newer to give). None: never (one refresh, as
    # --once: its one reading would count nothing).
    errors_every: float | None = 15.0


@dataclass
class _Later:
    """The queries asked beside the refreshes (inventory, budget, error counters): when,
    whether the whole inventory or the budget was due then, and their answers (None:
    failed)."""

    started: float
    with_budget: bool
    with_inventory: bool
    dense: frozenset[str]  # the GPU fields asked then (gpu_drawn asks of the others)
    answers: dict[str, Series | None] = field(default_factory=dict)


class PromSource:
    def __init__(self, url: str, cluster: PromSink, session: aiohttp.ClientSession,
                 options: PromOptions | None = None) -> None:
        self.options = options or PromOptions()
        o = self.options
        self.client = PromClient(url, session, token=o.token, tenant=o.tenant,
                                 ssl_context=o.ssl_context, timeout=o.timeout,
                                 concurrency=o.concurrency, recorded=o.recorded)
        self.url = self.client.url
        self.cluster = cluster
        self.reader = AnswerReader(every=o.every, budget_every=o.budget_every,
                                   errors_every=o.errors_every, node_labels=o.node_labels,
                                   node_aliases=o.node_aliases, slo_hours=o.slo_hours)
        self.refreshes = 0
        # With --recorded: refreshes that found the records as the last one read them,
        # and so asked nothing more (RecordReading.stands).
        self.refreshes_standing = 0
        self.last_refresh_read = False  # did the last refresh read the server's values?
        # Unix time of the last refresh that read the server, and why the last one that
        # did not failed (None once one reads again): what a headless judge serves.
        self.read_at: float | None = None
        self.error: str | None = None
        # Nodes the last refresh's answers named past MAX_NODES (left out).
        self.nodes_over = 0
        self._last_budget = -math.inf
        self._last_errors = -math.inf
        self._last_inventory = -math.inf
        self._ids = identity_labels(o.node_labels)
        self.records = RecordReading(self.client, o.match, self._ids, o.recorded)
        self._dense = q.DENSE_GPU  # the GPU fields the refresh asks of every GPU
        self._skipped: frozenset[str] = frozenset()  # the live queries it leaves out
        self._detailed: frozenset[str] = frozenset()  # the nodes it asks every value of
        self._refreshed_at: float | None = None  # monotonic: the last refresh's start
        self._gap = o.every  # seconds since the refresh before
        # While run() runs, after its first refresh: the inventory's, the budget's and the
        # error counters' queries in a task of their own (_take_later), whose _Later the
        # next refresh takes up.
        self._beside = False
        self._budget_names = frozenset(q.budget_queries(o.slo_hours))
        self._later: asyncio.Task[_Later] | None = None
        self._jobs_read = False  # did the last read find a node with jobs?

    @property
    def queries_run(self) -> int:
        return self.client.queries_run

    @property
    def bytes_read(self) -> int:
        return self.client.bytes_read

    async def run(self) -> None:
        """Refresh every `every` seconds, and at once when the view wants other fields or
        other nodes' detail (a metric switched, a node screen opened)."""
        wake = asyncio.Event()

        def wants() -> None:
            if self._asks_other():
                wake.set()
        self.cluster.add_wants_listener(wants)
        try:
            await self._run(wake)
        finally:
            self.cluster.remove_wants_listener(wants)
            if self._later is not None:
                self._later.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._later

    def _asks_other(self) -> bool:
        """Would a refresh now ask other fields or other nodes' detail than the last?"""
        return (self.cluster.detail_targets != self._detailed
                or self._asks_now() != (self._dense, self._skipped))

    def _asks_now(self) -> tuple[frozenset[str], frozenset[str]]:
        """(the GPU fields asked of every GPU, the live queries left out) now."""
        # A recording keeps every field; else the maps' cells only as they draw them.
        drawn = None if self.options.recorder is not None else self.cluster.drawn
        return (q.dense_gpu(drawn), q.skipped(drawn, bool(self.cluster.detail_targets)))

    async def _run(self, wake: asyncio.Event) -> None:
        while True:
            started = time.monotonic()
            wake.clear()
            try:
                await self.refresh()
                self._beside = True
                self.read_at, self.error = time.time(), None
                if self.cluster.source_is_lost(self.url):
                    log.warning("prometheus %s answers again", self.url)
                    self.cluster.source_back(self.url)
            except PromError as exc:
                if str(exc) != self.error:  # said once, not every refresh while it lasts
                    log.warning("%s", exc)
                self.error = str(exc)
                self._lost(str(exc))
                del exc
                # Its answers, read and refused, hang on the failure's traceback, a cycle
                # the collector, paused on a large heap (tuimon_core.heap), would leave
                # for a while: refreshes failing on answers of hundreds of megabytes
                # would pile them up. Rare, and at once.
                gc.collect()
            except Exception as exc:
                # A bug, or an answer no check foresaw: said on every node and logged;
                # the next refresh runs as usual (it used to end this task silently).
                log.exception("prometheus %s: refresh failed", self.url)
                self.error = clean(f"internal error reading prometheus: "
                                   f"{type(exc).__name__}: {exc}")[:200]
                self._lost(self.error)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(wake.wait(), max(
                    0.5, self.options.every - (time.monotonic() - started)))


    def _lost(self, reason: str) -> None:
        """A failed read: the server is lost and its nodes unknown (one finding, not one
        a node: nothing says the nodes are down), shown so at once."""
        self.cluster.source_lost(self.url, reason)
        self.cluster.read_applied()


    async def _optional(self, name: str, promql: str) -> Series | None:
        """A query the refresh can do without (the inventory, the budget, the detail of
        the open node screens): its failure is logged, None. An inventory record's answer
        is read as the query's own (RecordReading.as_query)."""
        try:
            return await self.records.as_query(name, await self.client.query(promql, name))
        except PromError as exc:
            log.warning("%s (%s: kept from before, asked again at the next refresh)", exc,
                        name)
            return None

    def _planned(self, now: float) -> tuple[dict[str, str], bool, bool]:
        """The queries this refresh runs (name -> PromQL), with or without the budget's
        and the inventory's."""
        match = self.options.match
        queries = {n: q.render(t, match, self._ids) for n, t in q.LIVE_QUERIES.items()}
        dense_before = self._dense
        self._dense, self._skipped = self._asks_now()
        keys = self._dense
        narrowed = keys != q.DENSE_GPU
        if narrowed:
            queries["gpu"] = q.render(q.gpus_query(keys), match, self._ids)
        if self.options.recorded:
            queries.update(live_rules.recorded_queries(
                match, self._ids, {"gpu": q.gpu_names(keys)} if narrowed else {}))
        presence = [k for k in q.PRESENCE_GPU if k not in keys]
        if not presence:
            del queries["gpu_nodes"]
        elif self.options.recorded:
            queries["gpu_nodes"] = live_rules.presence_query(match, self._ids)
        else:
            queries["gpu_nodes"] = q.render(q.presence_query(presence), match, self._ids)
        for name in self._skipped:
            del queries[name]
        errors_every = self.options.errors_every
        if errors_every is None or now - self._last_errors < errors_every - self.options.every / 2:
            del queries["ib_errors"]
        with_budget = now - self._last_budget >= self.options.budget_every
        if with_budget:
            queries.update({n: q.render(t, match) for n, t in
                            q.budget_queries(self.options.slo_hours).items()})
            queries.update({n: q.render(t, match, self._ids) for n, t in q.JOB_HOUR.items()})
        with_inventory = now - self._last_inventory >= q.INVENTORY_EVERY_S or (
            self.reader.inventory.due and now - self._last_inventory >= INVENTORY_SOONEST_S)
        # The whole inventory when due; else only what failed last time.
        asked = q.INVENTORY_QUERIES if with_inventory else {
            n: t for n, t in q.INVENTORY_QUERIES.items() if n in self.reader.inventory.failed}
        # The GPUs known only by a field asked while drawn: asked of the fields not asked
        # now, only while some are not (never by a recording), and at once when those
        # change.
        if self._dense != dense_before:
            self.reader.inventory.forget("gpu_drawn")
        asked = {n: t for n, t in asked.items() if n != "gpu_drawn"}
        if narrowed and (
                "gpu_drawn" in self.reader.inventory.failed or with_inventory
                or "gpu_drawn" not in self.reader.inventory.answers):
            asked["gpu_drawn"] = q.gpu_drawn_query(q.DRAWN_ONLY_GPU - self._dense)
        # With --recorded, their records (_optional asks the query where one has none).
        queries.update({n: self.records.inventory[n] if self.options.recorded
                        else q.render(t, match, self._ids) for n, t in asked.items()})
        # Every value of the nodes whose screen is open, and only of those.
        self._detailed = self.cluster.detail_targets
        detail = q.detail_query((m for name in self.cluster.detail_targets
                                 for m in self.reader.assembler.matchers.get(name, ())), match)
        if detail is not None:
            queries["gpu_detail"] = detail
        return queries, with_budget, with_inventory

    def _asked(self) -> tuple[Any, ...]:
        return self._dense, self._skipped, self._detailed


    def _goes_beside(self, name: str) -> bool:
        """Is this query asked in the task beside the refreshes (after run()'s first)?"""
        return self._beside and (
            name in q.INVENTORY_QUERIES or name in self._budget_names or name in q.JOB_HOUR
            or name == "ib_errors"
        ) and (
            # the GPUs known only by a drawn field, when the map first narrows: now
            name != "gpu_drawn" or name in self.reader.inventory.answers)

    def _take_later(self, now: float, queries: dict[str, str], with_budget: bool,
                    with_inventory: bool, take: bool = True) -> tuple[_Later | None, set[str]]:
        """After run()'s first refresh: the inventory's, the budget's and the error
        counters' queries this refresh planned go to a task beside it (they read much at a
        large site, and the live refresh should not wait on them), unless one runs
        already or waits to be taken up (they are planned again when due). Returns what a
        finished one brought, for this refresh to take up (where `take`), and the names
        taken out of `queries`."""
        brought = None
        task = self._later
        if take and task is not None and task.done():
            self._later = None
            if not task.cancelled() and task.exception() is not None:
                log.error("prometheus %s: the inventory's queries failed", self.url,
                          exc_info=task.exception())
            elif not task.cancelled():
                brought = task.result()
        if not self._beside:
            return brought, set()
        later = {n: queries.pop(n) for n in list(queries) if self._goes_beside(n)}
        if later and self._later is None:
            budget = with_budget and bool(later.keys() & self._budget_names)
            inventory = with_inventory and bool(later.keys() & q.INVENTORY_QUERIES.keys())
            # Not planned again while it runs, nor when it is taken up.
            if budget:
                self._last_budget = now
            if inventory:
                self._last_inventory = now
            if "ib_errors" in later:
                self._last_errors = now
            self._later = asyncio.create_task(
                self._ask_later(_Later(now, budget, inventory, self._dense), later),
                name="tuimon-prometheus-inventory")
        return brought, set(later)

    async def _ask_later(self, later: _Later, queries: dict[str, str]) -> _Later:
        # One at a time: the live refresh keeps the other places of the semaphore.
        for name, promql in queries.items():
            later.answers[name] = await self._optional(name, promql)
        return later


    async def refresh(self) -> None:
        """One refresh. Only the live queries must answer: an inventory, budget or
        detail query that fails is logged, what it gave before is kept, and it is asked
        again at the next refresh."""
        with heap.paused():  # the answers are many small objects, gone at the end
            await self._refresh()

    async def _refresh(self) -> None:
        now = time.monotonic()
        # A refresh asked early (a metric switched) sums the jobs' rates over less time.
        self._gap = self.options.every if self._refreshed_at is None else min(
            self.options.every, max(0.0, now - self._refreshed_at))
        self._refreshed_at = now
        queries, with_budget, with_inventory = self._planned(now)
        self.last_refresh_read = False
        evaluated = None
        stands = False
        # Not asked where this refresh reads whatever it says (a node with jobs at the
        # last read, an open screen's detail due): a query a refresh at such sites.
        if (self.options.recorded and self._beside and not self._jobs_read
                and "gpu_detail" not in queries):
            evaluated = await self.records.evaluated()
            stands = self.records.stands(
                evaluated, self._asked(), now, self.options.every,
                all(n in q.LIVE_QUERIES or self._goes_beside(n) for n in queries))
        # A refresh that stands leaves what the task beside brought to the next that reads.
        taken, moved = self._take_later(now, queries, with_budget, with_inventory,
                                        take=not stands)
        if stands:
            self.refreshes_standing += 1
            self.cluster.mark_current(self.reader.frames.sent_names)
            return
        # Set again when this read ends well: one that fails (the server away a moment)
        # must not leave the next to stand on the nodes it marked stale.
        self.records.read = None
        # Those gone to the task beside: taken up when it brings them, not now.
        with_budget = with_budget and not moved & self._budget_names
        with_inventory = with_inventory and not moved & q.INVENTORY_QUERIES.keys()
        answers, failed, taken_at = await self._ask(queries, taken, now)
        if taken is not None:
            with_budget = with_budget or taken.with_budget
            with_inventory = with_inventory or taken.with_inventory
        with_budget = with_budget and not failed & self._budget_names
        self.refreshes += 1
        if with_inventory:
            self._last_inventory = taken_at
        reader = self.reader
        resolver = reader.resolver(answers)
        read = reader.read(
            answers, resolver, clock=now, ts=time.time(), gap=self._gap, failed=failed,
            known=self.cluster.known_targets(), detail=self.cluster.detail_targets,
            dense=self._dense, held=self.cluster.holds_sample,
            inventory_at=taken_at if with_inventory else None,
            # Where the totals came from their records, a GPU newer than the records'
            # last evaluation (up to their interval before) is not in them yet.
            records_age=q.INVENTORY_EVERY_S if self.records.totals_recorded() else 0.0,
            with_budget=with_budget)
        self._note_over(read.over)
        failures = await self._failures(answers.get("up", []), resolver)
        broken = dict(read.broken)
        for name, frame in read.frames:
            if name in broken:
                continue
            try:  # one node's frames, alone: a value the model did not foresee is its
                self._deliver(name, frame)
            except Exception as exc:
                log.error("prometheus %s: the series of %s failed", self.url, name,
                          exc_info=exc)
                broken[name] = clean(f"internal error: {type(exc).__name__}: {exc}")[:200]
        for name, reason in broken.items():
            self.cluster.mark_stale(name, reason)
        if read.current:
            self.cluster.mark_current(read.current)
        nodes = read.nodes
        self.cluster.set_scrape_failures(failures)
        for name, reason in {n: r for n, r in failures.values()}.items():
            if name not in nodes:  # nothing else speaks for it: say why it is missing
                self.cluster.mark_stale(name, reason)
        for target in self.cluster.up_targets():
            if target not in nodes:
                self.cluster.mark_stale(target, "no series for this node in Prometheus")
        if read.budget is not None:
            self._last_budget = taken_at
            self.cluster.apply_budget(read.budget, self.url)
        self.last_refresh_read = True
        self.cluster.set_unasked(q.unasked(self._dense, self._skipped))
        self.cluster.read_applied()
        # A node with jobs is sent every refresh (its steps are counted per refresh).
        self._jobs_read = read.jobs
        if evaluated is not None and not self._jobs_read:
            self.records.read = (evaluated, self._asked(), now)

    async def _ask(self, queries: dict[str, str], taken: _Later | None, now: float
                   ) -> tuple[dict[str, Series], set[str], float]:
        """This refresh's answers, with what the task beside brought (as if this refresh
        had asked it): (answers, the optional queries that failed, when the inventory
        and budget they hold were asked)."""
        live = [n for n in queries if n in q.LIVE_QUERIES]
        rest = [n for n in queries if n not in q.LIVE_QUERIES]
        results = await all_or_none([*(self.client.query(queries[n], n) for n in live),
                                     *(self._optional(n, queries[n]) for n in rest)])
        answers: dict[str, Series] = {n: r or [] for n, r in zip(live, results[:len(live)])}
        if "ib_errors" in queries:
            self._last_errors = now
        if self.options.recorded:
            self.records.take(answers)
        brought = dict(zip(rest, results[len(live):]))
        taken_at = now
        if taken is not None:
            taken_at = taken.started
            if taken.dense != self._dense:  # of other fields than those not asked now
                taken.answers.pop("gpu_drawn", None)
            errors = taken.answers.get("ib_errors")
            if self.options.recorded and errors:
                self.records.warn_old_rules(errors)
                live_rules.restore_names(errors)
            if "ib_errors" in taken.answers and errors is None:
                self._last_errors = -math.inf  # failed: asked again at the next refresh
            brought.update(taken.answers)
        failed = {name for name, result in brought.items() if result is None}
        answers.update({name: result for name, result in brought.items() if result is not None})
        return answers, failed, taken_at

    def _note_over(self, over: set[str]) -> None:
        if len(over) != self.nodes_over:
            self.nodes_over = len(over)
            self.cluster.note_source_limit(self.url, None if not over else (
                f"prometheus {self.url} names more nodes than the {prom_assembly.MAX_NODES} shown "
                f"({len(over)}{'+' if len(over) >= prom_assembly.MAX_NODES else ''} left out, e.g. "
                f"{clean(sorted(over)[0])[:80]}); narrow the selection (--match)"))

    def _deliver(self, target: str, frame: Hello | Sample) -> None:
        """One frame of a node, checked as an agent's is, and applied. Packed only for a
        recording: else its wire map gets the same check without packing and unpacking
        it (a twentieth of a refresh), the map being what unpacking would give back.
        (The byte bound of a frame is not read then; the schema's bounds on every list
        are.)"""
        data: bytes | dict[str, Any]
        if self.options.recorder is not None:
            data = encode(frame)
            self.options.recorder(target, data)
        else:
            data = frame.to_wire()
        try:
            message = decode(data)
        except ProtocolError as exc:
            log.warning("prometheus data for %s refused: %s", target, exc.reason)
            self.cluster.note_protocol_error(target, exc.reason)
            return
        if not isinstance(message, (Subscribe, Batch)):  # never: the data is our own frame
            self.cluster.apply_message(target, message)

    async def _failures(self, up: Series,
                        resolver: NodeNames) -> dict[str, tuple[str, str]]:
        """Targets whose last scrape failed: "job instance" -> (node, reason)."""
        down = [labels for labels, value in up if value == 0]
        if not down:
            return {}
        errors = await self.client.scrape_errors()
        out = {}
        for labels in down:
            job, instance = labels.get("job", ""), labels.get("instance", "")
            name = resolver.of(labels) or instance
            why = errors.get((job, instance)) or "up is 0 (the server gave no reason)"
            out[f"{job} {instance}"] = (name, f"scrape of {job} at {instance} failed: {why}")
        return out


@contextlib.asynccontextmanager
async def prom_watching(url: str, cluster: PromSink,
                        options: PromOptions | None = None) -> AsyncIterator[PromSource]:
    """Refresh the cluster from Prometheus for the life of the block (as `watching()`
    does for agents), then cancel and await the refresh task."""
    async with aiohttp.ClientSession() as session:
        source = PromSource(url, cluster, session, options)
        task = asyncio.create_task(source.run(), name="tuimon-prometheus")
        try:
            yield source
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
