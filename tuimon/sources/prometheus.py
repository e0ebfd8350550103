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
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import math
import re
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiohttp

from tuimon.model.cluster import ClusterState
from tuimon.model.slo import BURN_WINDOWS_S, DEFAULT_HOURS
from tuimon.sources import prom_live_rules as live_rules
from tuimon.sources import prom_queries as q
from tuimon.sources.agent_stream import describe_error
from tuimon.sources.prom_answers import NotJson, Series, read_answer
from tuimon.sources.prom_nodes import NodeNames, identity_labels
from tuimon_core import heap
from tuimon_core.efficiency_drop import LONG_S, SHORT_S, DropJudge, judge_windows
from tuimon_core.protocol import (
    Batch,
    GpuInfo,
    Hello,
    ProtocolError,
    Sample,
    Subscribe,
    decode,
    encode,
)
from tuimon_core.protocol.fields import (
    GPU_FIELDS,
    HOST_FIELDS,
    PORT_ERROR_COUNTERS,
    PORT_PHYS_STATES,
    PORT_STATES,
    PORT_UNREADABLE_METRIC,
    link_util,
)
from tuimon_core.protocol.schema import Int, WireType
from tuimon_core.protocol.text import clean
from tuimon_core.version import __version__
from tuimon_core.wait_kinds import rank_kind, split_wait

log = logging.getLogger(__name__)

# Each field's type, by key: a series' value is made what its field holds (whole numbers
# where the field is an Int, within its bounds) before the frame goes to the decoder.
_GPU_KIND = {f.key: f.type for f in GPU_FIELDS}
_HOST_KIND = {f.key: f.type for f in HOST_FIELDS}


# Asked with every query: the newest samples, as they are. VictoriaMetrics otherwise moves
# a query for "now" 30 s back (-search.latencyOffset), so a new node shows half a minute
# late and every value is half a minute old; `nocache=1` keeps the time asked for. It
# also skips VictoriaMetrics' cache, the budget's queries over the SLO window included:
# without it a new job has no budget for half a minute, and they run every
# `budget_every` (30 s), not every refresh. Prometheus, Thanos and Mimir ignore
# parameters they do not know.
LIVE = {"nocache": "1"}

class PromError(Exception):
    """Prometheus could not answer; the message says which query and why."""


# The soonest the inventory runs again when a GPU lacks what it gives (a node new since).
INVENTORY_SOONEST_S = 15.0
# Memory is bounded by what a refresh holds, whatever the server answers
# (docs/security.md): each answer at most MAX_ANSWER_BYTES read (after decompression),
# at most MAX_HELD_SERIES series decoded in one refresh (about a kilobyte each once
# read: counted in the bytes before they are decoded), at most MAX_NODES nodes. Past
# the first two the refresh fails with the reason, every node stale; past the last, the
# nodes known first are kept and a finding says how many were left out. Enough for
# about 10,000 nodes of 8 GPUs; past that, --match (a shard each) or --recorded.
MAX_ANSWER_BYTES = 32 << 20
MAX_HELD_SERIES = 200_000
MAX_NODES = 16_384


async def _read_bounded(resp: aiohttp.ClientResponse, limit: int) -> bytearray | None:
    """The body, or None when it is longer than `limit` bytes (read no further). One
    buffer, grown in place: the chunks and their join would hold it twice."""
    if resp.content_length is not None and resp.content_length > limit:
        return None
    body = bytearray()
    async for chunk in resp.content.iter_chunked(1 << 20):
        if len(body) + len(chunk) > limit:
            return None
        body += chunk
    return body


async def _all_or_none(calls: list[Awaitable[Any]]) -> list[Any]:
    """Every call's result; where one fails, the others are cancelled (their answers,
    read or half read, are let go at once, not held while they finish for nothing) and
    its error raised."""
    tasks = [asyncio.ensure_future(c) for c in calls]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        tasks.clear()  # the tasks hold their answers; the error's traceback holds this frame
        raise


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
class _Node:
    # The values likeliest to differ from the last refresh's first: _unchanged compares
    # every node with the one last sent, field by field in this order, and stops at the
    # first that differs (a port's rates, where a GPU is idle).
    name: str
    ports: dict[str, dict[str, Any]] = field(default_factory=dict)
    host: dict[str, Any] = field(default_factory=dict)
    gpus: dict[int, dict[str, Any]] = field(default_factory=dict)
    gpu_info: dict[int, dict[str, Any]] = field(default_factory=dict)
    # GPU index -> GPU instance id -> values (dcgm-exporter in MIG mode)
    mig: dict[int, dict[int, dict[str, Any]]] = field(default_factory=dict)
    filesystems: dict[str, dict[str, Any]] = field(default_factory=dict)
    disks: dict[str, dict[str, Any]] = field(default_factory=dict)
    jobs: dict[str, dict[int, dict[str, float]]] = field(default_factory=dict)
    # Told by the presence answer (gpu_nodes): it has GPUs, whose series asked now may
    # be none (those the inventory knows are laid on it).
    present: bool = False


@dataclass
class _Kept(_Node):
    """What the inventory says of one node, read once per inventory and laid at every
    refresh onto the node the live answers made (onto its GPUs, MIG instances and ports
    there are now: it brings back none that has gone)."""

    exported: set[str] = field(default_factory=set)  # health counters, at 0 where absent
    # GPUs with a series asked only while drawn, and no other (once laid on the node the
    # live answers made at the inventory's refresh: `fresh` until then).
    drawn: set[int] = field(default_factory=set)
    fresh: bool = True
    port_rates: dict[str, float] = field(default_factory=dict)
    matchers: set[str] = field(default_factory=set)  # its screen's detail query


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
    def __init__(self, url: str, cluster: ClusterState, session: aiohttp.ClientSession,
                 options: PromOptions | None = None) -> None:
        self.url = url.rstrip("/")
        self.cluster = cluster
        self.session = session
        self.options = options or PromOptions()
        self.queries_run = 0
        self.refreshes = 0
        # With --recorded: refreshes that found the records as the last one read them,
        # and so asked nothing more (_stands).
        self.refreshes_standing = 0
        self.last_refresh_read = False  # did the last refresh read the server's values?
        # Unix time of the last refresh that read the server, and why the last one that
        # did not failed (None once one reads again): what a headless judge serves.
        self.read_at: float | None = None
        self.error: str | None = None
        self.bytes_read = 0  # answers' bytes as parsed (after decompression)
        # Series of the answers held, by query name (at most one answer a name is kept):
        # what bounds the memory answers take (_hold).
        self._held: dict[str, int] = {}
        self._held_total = 0
        # Nodes the last refresh's answers named past MAX_NODES (left out).
        self.nodes_over = 0
        self._seq = 0
        self._inventory: dict[str, tuple[Any, ...]] = {}
        self._last_budget = -math.inf
        self._last_errors = -math.inf
        # node -> port -> its state, at the last read of the error counters, and when
        self._ports_read: dict[str, dict[str, float]] = {}
        self._ports_read_at = -math.inf
        self._last_inventory = -math.inf
        self._inventory_failed: set[str] = set()  # asked again at the next refresh
        # A GPU without its total (new since the inventory): the inventory runs soon.
        self._inventory_due = False
        self._lacking_after_inventory: set[tuple[str, int, int | None]] = set()
        self._lacking_since: dict[tuple[str, int, int | None], float] = {}  # monotonic
        # The inventory's answers (prom_queries.INVENTORY_QUERIES), kept between its runs,
        # and what they say of each node, read once per inventory (not at every refresh:
        # a quarter of the series a refresh would read again), with the host names they
        # were read with.
        self._inventory_answers: dict[str, Series] = {}
        self._kept: dict[str, _Kept] = {}
        self._kept_hosts: dict[str, str] | None = None
        self._said_old_rules = False
        # Each node as last sent (prometheus._unchanged).
        self._sent: dict[str, _Node] = {}
        # node -> (when, port -> its error counters as last read: (from our agent,
        # kind -> total))
        self._port_errors: dict[str, tuple[float, dict[str, tuple[bool, dict[str, float]]]]] = {}
        # node -> label matchers that select its series (for its screen's detail query)
        self._matchers: dict[str, set[str]] = {}
        self._ids = identity_labels(self.options.node_labels)
        # With --recorded: an inventory query -> its record's query, and the PromQL the
        # record stands for, asked where the record has no series (_unrecorded_answer;
        # gpu_drawn's of every field, as recorded: whatever fields the map draws when it
        # answers); the records said missing.
        match = self.options.match
        self._inventory_records = (live_rules.recorded_inventory(match, self._ids)
                                   if self.options.recorded else {})
        self._unrecorded = {n: q.render(live_rules.inventory_query(n), match, self._ids)
                            for n in self._inventory_records}
        self._said_unrecorded: set[str] = set()
        # Did each inventory query's last answer come from its record (up to its
        # interval old), not from the series?
        self._answered_by_record: dict[str, bool] = {}
        self._sem = asyncio.Semaphore(self.options.concurrency)
        self._dense = q.DENSE_GPU  # the GPU fields the refresh asks of every GPU
        self._skipped: frozenset[str] = frozenset()  # the live queries it leaves out
        self._detailed: frozenset[str] = frozenset()  # the nodes it asks every value of
        self._refreshed_at: float | None = None  # monotonic: the last refresh's start
        self._gap = self.options.every  # seconds since the refresh before
        # While run() runs, after its first refresh: the inventory's, the budget's and the
        # error counters' queries in a task of their own (_take_later), whose _Later the
        # next refresh takes up.
        self._beside = False
        self._budget_names = frozenset(q.budget_queries(self.options.slo_hours))
        # node -> job -> the last hour's sums on it (JOB_HOUR), as the last read that
        # answered both wall and compute found them, and when (monotonic); and a drop
        # judge a node and job, as its agent would keep.
        self._job_hours: dict[str, dict[str, dict[str, Any]]] = {}
        self._job_hours_at: float | None = None
        self._drops: dict[tuple[str, str], DropJudge] = {}
        # node -> (job, rank) -> the fraction of a step its rates counted, not yet sent
        self._step_carry: dict[str, dict[tuple[str, int], float]] = {}
        self._later: asyncio.Task[_Later] | None = None
        # With --recorded, after a refresh that read the records: when the server last
        # evaluated them, what the refresh asked (the fields, the queries left out, the
        # nodes asked whole) and when it began. None where the next refresh must read.
        self._records_read: tuple[dict[str, float], Any, float] | None = None
        # While refreshes stand to wait for the rest of an evaluation (_stands): how many
        # have, how many may, and the newest evaluation time when the wait began.
        self._waited: tuple[int, int, float] | None = None
        self._jobs_read = False  # did the last read find a node with jobs?
        self._probes: dict[str, dict[str, str]] = {}  # prom_live_rules.evaluated_query

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
                if self.url in self.cluster.lost_sources:
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

    def _headers(self) -> dict[str, str]:
        headers = {"Authorization": f"Bearer {self.options.token}"} if self.options.token else {}
        if self.options.tenant:
            headers["X-Scope-OrgID"] = self.options.tenant
        return headers

    async def _get(self, path: str, params: dict[str, str]) -> tuple[int, bytes | bytearray]:
        try:
            async with self.session.get(
                    f"{self.url}{path}", params=params, headers=self._headers(),
                    ssl=self.options.ssl_context or True,
                    timeout=aiohttp.ClientTimeout(total=self.options.timeout)) as resp:
                if resp.status == 401:  # the token, or a multi-tenant store's tenant
                    said = clean((await resp.content.read(200)).decode(errors="replace"))
                    raise PromError(f"prometheus {self.url}: refused (401): "
                                    f"{said.strip() or 'wrong or missing token'}")
                body = await _read_bounded(resp, MAX_ANSWER_BYTES)
                if body is None:
                    raise PromError(f"prometheus {self.url}: an answer over "
                                    f"{MAX_ANSWER_BYTES >> 20} MiB ({path}): refused; narrow "
                                    "the selection (--match)")
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
            raise PromError(f"prometheus {self.url}: {describe_error(exc)}") from None
        self.bytes_read += len(body)
        return resp.status, body

    def _not_json(self, status: int, path: str) -> PromError:
        return PromError(f"prometheus {self.url}: HTTP {status}, not a JSON answer ({path})")

    def _hold(self, key: str, count: int) -> None:
        """Room for an answer of `count` series about to be decoded, in place of the
        last answer to `key` (what its query name holds): at most MAX_HELD_SERIES over
        every answer kept, counted in the bytes before any is decoded."""
        others = self._held_total - self._held.get(key, 0)
        if others + count > MAX_HELD_SERIES:
            raise PromError(f"prometheus {self.url}: its answers name more than "
                            f"{MAX_HELD_SERIES} series together ({count} in {key[:60]}): "
                            "refused; narrow the selection (--match) or read records "
                            "(--recorded)")
        self._held[key] = count
        self._held_total = others + count

    async def query(self, promql: str, name: str | None = None) -> Series:
        """One instant query at the server's now, as stored (LIVE); `name`: the query's
        name, under which its answer is held (the query itself where none is given)."""
        async with self._sem:
            self.queries_run += 1
            status, body = await self._get("/api/v1/query", {"query": promql, **LIVE})
            self._hold(name or promql, body.count(b'"metric"'))
        try:
            parsed, samples = read_answer(body)
        except NotJson:
            raise self._not_json(status, "/api/v1/query") from None
        if samples is None:
            error = parsed.get("error") if isinstance(parsed, dict) else None
            raise PromError(clean(f"prometheus {self.url}: query failed: "
                                  f"{str(error or parsed)[:200]} ({promql[:80]})"))
        return samples

    async def _optional(self, name: str, promql: str) -> Series | None:
        """A query the refresh can do without (the inventory, the budget, the detail of
        the open node screens): its failure is logged, None. An inventory record's answer
        is read as the query's own (its series names restored), and one with no series
        is replaced by the query's (_unrecorded_answer)."""
        try:
            answer = await self.query(promql, name)
            unrecorded = self._unrecorded.get(name)
            if unrecorded is None:
                return answer
            self._answered_by_record[name] = bool(answer)
            if not answer:
                return await self._unrecorded_answer(name, unrecorded)
            live_rules.restore_names(answer)
            return answer
        except PromError as exc:
            log.warning("%s (%s: kept from before, asked again at the next refresh)", exc,
                        name)
            return None

    async def _unrecorded_answer(self, name: str, promql: str) -> Series:
        """An inventory record with no series: the query it records asked instead (rules
        of an older tuimon, without the inventory's group; or a group loaded and not
        evaluated yet, up to a minute). Said once, where the query finds what the record
        lacks (an answer both leave empty is no news: no node has such a series)."""
        answer = await self.query(promql, name)
        if answer and name not in self._said_unrecorded:
            self._said_unrecorded.add(name)
            log.warning("prometheus %s: no series %s, though the series it records answer: "
                        "the inventory's group of `tuimon rules --live` is not loaded (rules "
                        "of an older tuimon) or not evaluated yet; read from the series "
                        "meanwhile", self.url, live_rules.inventory_name(name))
        return answer

    async def scrape_errors(self) -> dict[tuple[str, str], str]:
        """(job, instance) -> why the last scrape failed, from the targets API; empty
        where the server has none (Thanos, Mimir) or it answers nothing useful."""
        try:
            async with self._sem:
                status, raw = await self._get("/api/v1/targets", {"state": "active"})
                self._hold("targets", raw.count(b'"scrapeUrl"'))  # one a target
            body = json.loads(raw)
        except (PromError, ValueError, RecursionError):
            return {}
        if status != 200 or not isinstance(body, dict):
            return {}
        out = {}
        data = body.get("data")
        targets = data.get("activeTargets") if isinstance(data, dict) else None
        for t in targets if isinstance(targets, list) else ():
            if not isinstance(t, dict) or t.get("health") == "up":
                continue
            labels = t.get("labels")
            labels = labels if isinstance(labels, dict) else {}
            error = clean(str(t.get("lastError") or "").strip())[:300]
            if error:
                out[(str(labels.get("job", "")), str(labels.get("instance", "")))] = error
        return out

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
            self._inventory_due and now - self._last_inventory >= INVENTORY_SOONEST_S)
        # The whole inventory when due; else only what failed last time.
        asked = q.INVENTORY_QUERIES if with_inventory else {
            n: t for n, t in q.INVENTORY_QUERIES.items() if n in self._inventory_failed}
        # The GPUs known only by a field asked while drawn: asked of the fields not asked
        # now, only while some are not (never by a recording), and at once when those
        # change.
        if self._dense != dense_before:
            self._inventory_answers.pop("gpu_drawn", None)
        asked = {n: t for n, t in asked.items() if n != "gpu_drawn"}
        if narrowed and (
                "gpu_drawn" in self._inventory_failed or with_inventory
                or "gpu_drawn" not in self._inventory_answers):
            asked["gpu_drawn"] = q.gpu_drawn_query(q.DRAWN_ONLY_GPU - self._dense)
        # With --recorded, their records (_optional asks the query where one has none).
        queries.update({n: self._inventory_records[n] if self.options.recorded
                        else q.render(t, match, self._ids) for n, t in asked.items()})
        # Every value of the nodes whose screen is open, and only of those.
        self._detailed = self.cluster.detail_targets
        detail = q.detail_query((m for name in self.cluster.detail_targets
                                 for m in self._matchers.get(name, ())), match)
        if detail is not None:
            queries["gpu_detail"] = detail
        return queries, with_budget, with_inventory

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
            evaluated = await self._records_evaluated()
            stands = self._stands(evaluated, queries, now)
        # A refresh that stands leaves what the task beside brought to the next that reads.
        taken, moved = self._take_later(now, queries, with_budget, with_inventory,
                                        take=not stands)
        if stands:
            self.refreshes_standing += 1
            self.cluster.mark_current(list(self._sent))
            return
        # Set again when this read ends well: one that fails (the server away a moment)
        # must not leave the next to stand on the nodes it marked stale.
        self._records_read = None
        # Those gone to the task beside: taken up when it brings them, not now.
        with_budget = with_budget and not moved & self._budget_names
        with_inventory = with_inventory and not moved & q.INVENTORY_QUERIES.keys()
        live = [n for n in queries if n in q.LIVE_QUERIES]
        rest = [n for n in queries if n not in q.LIVE_QUERIES]
        results = await _all_or_none([*(self.query(queries[n], n) for n in live),
                                      *(self._optional(n, queries[n]) for n in rest)])
        answers: dict[str, Series] = {n: r or [] for n, r in zip(live, results[:len(live)])}
        if "ib_errors" in queries:
            self._last_errors = now
        if self.options.recorded:
            self._from_records(answers)
        failed = set()
        # What the task beside the refreshes brought, as if this refresh had asked it.
        inventory_at = now
        if taken is not None:
            inventory_at = taken.started
            if taken.dense != self._dense:  # of other fields than those not asked now
                taken.answers.pop("gpu_drawn", None)
            if self.options.recorded and taken.answers.get("ib_errors"):
                self._warn_old_rules(taken.answers["ib_errors"] or [])
                live_rules.restore_names(taken.answers["ib_errors"] or [])
            if "ib_errors" in taken.answers and taken.answers["ib_errors"] is None:
                self._last_errors = -math.inf  # failed: asked again at the next refresh
            rest += list(taken.answers)
            results += list(taken.answers.values())
            with_budget = with_budget or taken.with_budget
            with_inventory = with_inventory or taken.with_inventory
        for name, result in zip(rest, results[len(live):]):
            if result is None:
                failed.add(name)
            else:
                answers[name] = result
        asked = [n for n in q.INVENTORY_QUERIES if n in rest]
        self._inventory_answers.update({n: answers[n] for n in asked if n not in failed})
        if set(asked) - failed:
            self._kept_hosts = None  # read again below
        self._inventory_failed = (self._inventory_failed - set(asked)) | (failed & set(asked))
        if with_inventory:
            self._last_inventory = inventory_at
        if "gpu_info" in asked and "gpu_info" not in failed:
            self._matchers = {}  # learnt again from this inventory
        with_budget = with_budget and not failed & self._budget_names
        self.refreshes += 1
        resolver = NodeNames(self.options.node_labels, self.options.node_aliases)
        resolver.learn_uname(answers.get("uname", []))
        if self._kept_hosts != resolver.hosts:
            self._kept = self._read_inventory(resolver)
            self._kept_hosts = dict(resolver.hosts)
        nodes = self._assemble(answers, resolver)
        self._count_port_errors(nodes)
        self._matchers = {name: m for name, m in self._matchers.items() if name in nodes}
        # GPUs without their total (whether or not their memory used was asked): brought
        # forward only for one the last inventory did not already leave so (an exporter
        # that gives no total at all would otherwise have it run every 15 s for ever).
        lacking = {(n.name, i, gi) for n in nodes.values()
                   for i, gi, g in [*((i, None, g) for i, g in n.gpus.items()),
                                    *((i, gi, v) for i, m in n.mig.items()
                                      for gi, v in m.items())]
                   if "mem_total" not in g}
        # A node with GPUs, none of them known to the inventory yet: it tells them.
        lacking |= {(n.name, -1, None) for n in nodes.values() if n.present and not n.gpus}
        self._lacking_since = {k: self._lacking_since.get(k, now) for k in lacking}
        if with_inventory:
            # Left so by this inventory: lacking since before it was asked, and where
            # the totals came from their records, before the records' last evaluation
            # (up to their interval before: a GPU newer than that is not in them yet).
            recorded = any(self._answered_by_record.get(n) for n in q.TOTALS)
            age = q.INVENTORY_EVERY_S if recorded else 0.0
            self._lacking_after_inventory = {
                k for k, since in self._lacking_since.items() if since <= inventory_at - age}
        self._inventory_due = bool(lacking - self._lacking_after_inventory)
        failures = await self._failures(answers.get("up", []), resolver)
        ts = time.time()
        # A job's world is not a label: the highest rank seen on any node stands for it.
        worlds: dict[str, int] = {}
        for node in nodes.values():
            for job, ranks in node.jobs.items():
                worlds[job] = max(worlds.get(job, 0), max(ranks) + 1)
        current = []
        for name, node in nodes.items():
            if self._unchanged(name, node):
                current.append(name)
                continue
            try:  # one node's series, alone: a value no check foresaw is that node's
                self._emit(name, node, ts, worlds)
                self._sent[name] = node
            except Exception as exc:
                log.error("prometheus %s: the series of %s failed", self.url, name,
                          exc_info=exc)
                self.cluster.mark_stale(name, clean(f"internal error: {type(exc).__name__}: "
                                                    f"{exc}")[:200])
        self._sent = {name: n for name, n in self._sent.items() if name in nodes}
        self._step_carry = {name: c for name, c in self._step_carry.items() if name in nodes}
        if current:
            self.cluster.mark_current(current)
        self.cluster.set_scrape_failures(failures)
        for name, reason in {n: r for n, r in failures.values()}.items():
            if name not in nodes:  # nothing else speaks for it: say why it is missing
                self.cluster.mark_stale(name, reason)
        for target, state in self.cluster.nodes.items():
            if target not in nodes and state.status == "up":
                self.cluster.mark_stale(target, "no series for this node in Prometheus")
        if with_budget:
            self._last_budget = inventory_at
            self.cluster.apply_budget(_budget(answers, self.options.slo_hours), self.url)
        self.last_refresh_read = True
        self.cluster.set_unasked(q.unasked(self._dense, self._skipped))
        self.cluster.read_applied()
        # A node with jobs is sent every refresh (its steps are counted per refresh).
        self._jobs_read = any(n.jobs for n in nodes.values())
        if evaluated is not None and not self._jobs_read:
            self._records_read = (evaluated, self._asked(), now)

    def _asked(self) -> tuple[Any, ...]:
        return self._dense, self._skipped, self._detailed

    async def _records_evaluated(self) -> dict[str, float] | None:
        """When the server last evaluated each record the last read read (by record: a
        read between the first and the last of a group's finds some old, and one whose
        rule fails keeps its old time while the others move on). None: unknown, or a
        series that told it is gone (its node: the next read finds others)."""
        promql = live_rules.evaluated_query(self.options.match, self._probes)
        if not promql:
            return None
        try:
            answer = await self.query(promql, "evaluated")
        except PromError as exc:
            log.debug("%s (the records' evaluation time)", exc)
            return None
        label = live_rules.RECORD_LABEL
        times = {labels[label]: value for labels, value in answer if label in labels}
        return times if times.keys() == self._probes.keys() else None

    def _stands(self, evaluated: dict[str, float] | None, queries: dict[str, str],
                now: float) -> bool:
        """With --recorded: does this refresh find every record as the last one read it,
        with nothing else to read now? Then the values are as they were, and reading and
        assembling every node's series again (a third of a core at 4096 nodes) would
        say nothing new: the records change once per evaluation interval (`tuimon rules
        --live --every`), whatever the refresh's. Not so where the view asks other
        fields or nodes, an open screen's detail is read, or a node has jobs; and never
        longer than STAND_MAX_S (records that stopped: a ruler down or failing). What runs
        beside (the inventory, the budget, the error counters) is taken up by the next
        refresh that reads.

        Where some records were evaluated since the last read and others not yet, the
        refresh stands too (`_waited`): a group's records are stored one after another,
        seconds apart at thousands of nodes (5-7 s at 4096), so a read now would read the
        evaluation twice, half of it old. It waits for the records of the newest
        evaluation that were level with the newest at the last read, for as many
        refreshes as fit before the next evaluation (the interval between the two reads'
        newest times, in whole refreshes, less one: none where the rules run as often as
        the refreshes, or less often), set when the wait begins, and not once a newer
        evaluation shows (waiting on would chase it). One behind at the last read is
        stuck (its rule failing) and waited for no more."""
        read = self._records_read
        waited, self._waited = self._waited, None
        if not (evaluated is not None and read is not None
                and read[1] == self._asked() and now - read[2] < STAND_MAX_S
                and all(n in q.LIVE_QUERIES or self._goes_beside(n) for n in queries)):
            return False
        last = read[0]
        if last == evaluated:
            return True
        newest, last_newest = max(evaluated.values()), max(last.values())
        if not any(t < newest and last.get(n) == last_newest for n, t in evaluated.items()):
            return False
        if waited is None:
            most = math.floor((newest - last_newest) / self.options.every) - 1
            waited = (0, most, newest)
        stood, most, began = waited
        if newest != began or stood >= most:
            return False
        self._waited = (stood + 1, most, began)
        return True

    def _goes_beside(self, name: str) -> bool:
        """Is this query asked in the task beside the refreshes (after run()'s first)?"""
        return self._beside and (
            name in q.INVENTORY_QUERIES or name in self._budget_names or name in q.JOB_HOUR
            or name == "ib_errors"
        ) and (
            # the GPUs known only by a drawn field, when the map first narrows: now
            name != "gpu_drawn" or name in self._inventory_answers)

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

    def _keep_ports_read(self, nodes: dict[str, _Node], read: bool) -> None:
        """The ports whose state answered at the last read of the error counters stand
        for the node's ports until the next (every 15 s): between two reads, a port with
        no other series asked (no xmit_wait, its traffic not drawn) is still there."""
        if read:
            self._ports_read_at = time.monotonic()
            self._ports_read = {name: {pid: state for pid, p in n.ports.items()
                                       if (state := _state_read(p)) is not None}
                                for name, n in nodes.items()}
        for name, n in nodes.items():
            for pid in self._ports_read.get(name, {}):
                if pid not in n.ports:
                    n.ports[pid] = {"id": pid}

    def _fill_active(self, nodes: dict[str, _Node]) -> None:
        """A port the last read of the counters found ACTIVE, that the live query of the
        states other than ACTIVE does not name now, is ACTIVE (the node screen says so,
        not "-"). One that read found otherwise stays unknown (the live query may have
        no answer of its own: a record whose rule fails), and so does every port where
        that read is older than two of its intervals (the counters' query failing).
        After the machines named twice are merged, so that one name's live state is not
        lost to the other's ACTIVE."""
        every = self.options.errors_every
        if every is None or time.monotonic() - self._ports_read_at > 2 * every:
            return
        active = float(q.PORT_HEALTHY["state"])
        for name, n in nodes.items():
            for pid, state in self._ports_read.get(name, {}).items():
                port = n.ports.get(pid)
                if port is not None and state == active:
                    port.setdefault("state", active)

    def _count_port_errors(self, nodes: dict[str, _Node]) -> None:
        """Each port's error counts since the last refresh, by kind (the wire's
        `errors_inc`), from its counters now and at the last reading. A port's counters
        are read when its exporter's last scrape is in the answer (its state answered:
        prom_queries.PORT_READ_SERIES); then a counter absent from it is 0, unless its
        exporter says it could not read it (our agent's PORT_UNREADABLE_METRIC): that
        one is as last read, and one not read since it could not be counts from when it
        is. Not read (a failed scrape, a target being replaced), they are as last read,
        and what they grew by meanwhile is counted when they are read again. A port
        first read, or read from the other exporter than last time, counts from now (its
        counters' past is not news); a counter that went down was reset (a reboot, a
        driver reload) and counts from there."""
        before = self._port_errors
        clock = time.monotonic()
        # A node absent from this refresh keeps its readings a while (its scrapes failing
        # for minutes, or its name not resolved this once): read again, it counts on.
        now = {name: entry for name, entry in before.items()
               if name not in nodes and clock - entry[0] < PORT_ERRORS_KEPT_S}
        for name, n in nodes.items():
            last = before.get(name, (clock, {}))[1]
            kept = dict(last)  # its ports absent this refresh: as last read
            now[name] = (clock, kept)
            for pid, p in n.ports.items():
                ours, theirs = p.pop(_ERRORS_OURS, None), p.pop(_ERRORS_NODE, None)
                was = last.get(pid)
                if ours is not None and _READ in ours:
                    read = (True, ours)  # both exporters on one node: ours, as elsewhere
                elif theirs is not None and _READ in theirs:
                    read = (False, theirs)
                else:
                    continue  # not read: as last read
                kept[pid] = read
                if was is None or was[0] != read[0]:
                    continue
                then, counters = was[1], read[1]
                grew = {}
                for kind, value in counters.items():
                    if kind == _READ:
                        continue
                    known = then.get(kind, 0.0)
                    if value != value:  # its exporter could not read it: as last read
                        counters[kind] = known
                        continue
                    # None where it went down (a reset), is past a count, or was not read
                    # last time (NaN): it counts from now.
                    count = _whole(value - known)
                    if count:
                        grew[kind] = count
                if grew:
                    p["errors_inc"] = grew
        self._port_errors = now

    def _unchanged(self, name: str, node: _Node) -> bool:
        """Is this node, up, as it was sent last? The server has scraped it no newer
        since (a scrape every 15 or 30 s, a refresh every 5 s): sending the same values
        again would cost the viewer a sample's work and say nothing. A node with jobs is
        sent every refresh (its steps are counted per refresh), and so is a node whose
        screen was closed since (its whole sample was let go) and one with new port
        errors."""
        state = self.cluster.nodes.get(name)
        if any("errors_inc" in p for p in node.ports.values()):
            return False  # new errors, even as many as the last time
        return (not node.jobs and state is not None and state.status == "up"
                and state.detail is not None and self._sent.get(name) == node)

    def _from_records(self, answers: dict[str, Series]) -> None:
        """The records' answers read as the queries' own; none at all is an error that
        says what to load (they are what the maps and the rules read)."""
        recorded = [answers.get(name, []) for name in live_rules.RECORDED]
        if not any(recorded):
            raise PromError(f"prometheus {self.url}: no series "
                            f"{live_rules.record_name('gpu')} or the other records "
                            "--recorded reads: load the rules `tuimon rules --live` writes "
                            "(with this --match and --node-label), or leave out --recorded")
        self._warn_old_rules(answers.get("ib_errors", []))
        # A series of each record read every refresh, as it answered (its own labels):
        # what the next refresh asks the evaluation time of.
        self._probes = {name: dict(answers[name][0][0]) for name in live_rules.RECORDED
                        if answers.get(name) and name != "ib_errors"}
        for series in recorded:
            live_rules.restore_names(series)

    def _warn_old_rules(self, errors: Series) -> None:
        """A record of the error counters without their names (rules of an older tuimon):
        said once, as it holds until the rules are written again."""
        if errors and live_rules.NAME_LABEL not in errors[0][0] and not self._said_old_rules:
            self._said_old_rules = True
            log.warning("prometheus %s: %s holds no counter names: rules of an older tuimon;"
                        " port errors go uncounted until `tuimon rules --live` is loaded "
                        "again", self.url, live_rules.record_name("ib_errors"))

    async def _failures(self, up: Series,
                        resolver: NodeNames) -> dict[str, tuple[str, str]]:
        """Targets whose last scrape failed: "job instance" -> (node, reason)."""
        down = [labels for labels, value in up if value == 0]
        if not down:
            return {}
        errors = await self.scrape_errors()
        out = {}
        for labels in down:
            job, instance = labels.get("job", ""), labels.get("instance", "")
            name = resolver.of(labels) or instance
            why = errors.get((job, instance)) or "up is 0 (the server gave no reason)"
            out[f"{job} {instance}"] = (name, f"scrape of {job} at {instance} failed: {why}")
        return out

    # -- answers to nodes -----------------------------------------------------------

    @staticmethod
    def _hours(a: dict[str, Series], node: Callable[[dict[str, str]], _Node | None]
               ) -> dict[str, dict[str, dict[str, Any]]]:
        """Each node's last hour of each job (JOB_HOUR's answers)."""
        out: dict[str, dict[str, dict[str, Any]]] = {}
        for key in ("wall", "compute", "samples"):
            for labels, value in a.get(f"hour_{key}", []):
                job = labels.get("exported_job") or labels.get("job")
                n = node(labels) if job else None
                if n is not None and job:
                    out.setdefault(n.name, {}).setdefault(job, {"waits": {}})[key] = value
        for labels, value in a.get("hour_waits", []):
            job = labels.get("exported_job") or labels.get("job")
            kind = labels.get("kind")
            n = node(labels) if job and kind else None
            if n is not None and job:
                waits = out.setdefault(n.name, {}).setdefault(job, {"waits": {}})["waits"]
                waits[rank_kind(kind)] = waits.get(rank_kind(kind), 0.0) + value
        # A job's hour only with both its wall and its compute: one alone is no SLI.
        return {name: kept for name, jobs in out.items()
                if (kept := {job: h for job, h in jobs.items()
                             if "wall" in h and "compute" in h})}

    def _assemble(self, a: dict[str, Series], resolver: NodeNames) -> dict[str, _Node]:
        nodes: dict[str, _Node] = {}
        # Made only when a series carries something (a series with no GPU, port or host
        # value makes no phantom node); at most MAX_NODES, those known before first.
        over: set[str] = set()
        node = _namer(resolver, nodes, _Node, MAX_NODES, self.cluster.nodes, over)

        # A node whose screen is open has every series in the detail answer: the others
        # would count its summed fields twice.
        detailed = self._gpus(a.get("gpu_detail", []), node)
        for answer in ("gpu", "gpu_busy", "gpu_sparse"):
            self._gpus(a.get(answer, []), node, skip=detailed, learn=resolver)
        for labels, _ in a.get("clock_events", []):
            index = _int(labels.get("gpu"))
            if index is not None and labels.get("reason"):
                n = node(labels)
                if n is not None:
                    n.gpus.setdefault(index, {}).setdefault("clock_events", []).append(
                        labels["reason"])
        for labels, value in a.get("host", []):
            metric = labels.get("__name__", "")
            if metric in q.HOST:
                n = node(labels)
                if n is not None:
                    key, scale, _ = q.HOST[metric]
                    n.host.setdefault(key, value * scale)
        for labels, value in a.get("host_cpu", []):
            n = node(labels)
            if n is not None:
                n.host.setdefault("cpu_util", min(1.0, max(0.0, value)))
        detail = self.cluster.detail_targets
        for labels, _ in a.get("gpu_nodes", []):
            n = node(labels)
            if n is not None:
                n.present = True
                if n.name in detail and n.name not in self._matchers:  # its screen's
                    self._learn_matcher(n.name, resolver, labels)
        self._ports(a, node)
        self._keep_ports_read(nodes, "ib_errors" in a)
        for name, n in nodes.items():
            kept = self._kept.get(name)
            if kept is not None:
                self._apply_kept(n, kept, name in detailed)
        self._storage(a, node)
        for key in ("wall", "compute", "samples", "steps"):
            for labels, value in a.get(f"job_{key}", []):
                rank = _int(labels.get("rank"))
                job = labels.get("exported_job") or labels.get("job")
                if rank is not None and job:
                    n = node(labels)
                    if n is not None:
                        n.jobs.setdefault(job, {}).setdefault(rank, {})[key] = value
        for labels, value in a.get("job_waits", []):
            rank = _int(labels.get("rank"))
            job = labels.get("exported_job") or labels.get("job")
            kind = labels.get("kind")
            if rank is None or not job or not kind:
                continue
            n = node(labels)
            if n is not None:
                rates = n.jobs.setdefault(job, {}).setdefault(rank, {})
                key = f"wait:{rank_kind(kind)}"  # at most the known kinds, whatever comes
                rates[key] = rates.get(key, 0.0) + value
        # Only the nodes the live answers made: the hour's increase still names a node
        # for an hour after its series stopped, and must not bring it back up.
        hours = (self._hours(a, lambda labels: nodes.get(resolver.of(labels) or ""))
                 if "hour_wall" in a and "hour_compute" in a else None)
        # `gpu001.cluster.local` and `gpu001` are one machine.
        for long, short in NodeNames.short_forms(nodes).items():
            _merge(nodes[short], nodes.pop(long))
            self._matchers.setdefault(short, set()).update(self._matchers.pop(long, set()))
            if hours is not None and long in hours:
                hours[short] = {**hours.pop(long), **hours.get(short, {})}
        if hours is not None:
            self._job_hours, self._job_hours_at = hours, time.monotonic()
            for gone in [k for k in self._drops if k[1] not in hours.get(k[0], ())]:
                del self._drops[gone]  # a job gone from the node: its judge with it
        self._fill_active(nodes)
        if len(over) != self.nodes_over:
            self.nodes_over = len(over)
            self.cluster.note_source_limit(self.url, None if not over else (
                f"prometheus {self.url} names more nodes than the {MAX_NODES} shown "
                f"({len(over)}{'+' if len(over) >= MAX_NODES else ''} left out, e.g. "
                f"{clean(sorted(over)[0])[:80]}); narrow the selection (--match)"))
        return nodes

    def _gpus(self, series: Series, node: Callable[[dict[str, str]], _Node | None],
              skip: set[str] | frozenset[str] = frozenset(),
              learn: NodeNames | None = None) -> set[str]:
        """GPU values, ours or dcgm-exporter's, onto their nodes (not those in `skip`).
        Returns the nodes it wrote to. With `learn`, a node whose screen is open and has
        no label matcher yet gets one (a node new since the inventory)."""
        ranks: dict[tuple[str, int, int | None, str], int] = {}
        wrote: set[str] = set()
        detail = self.cluster.detail_targets
        table = q.GPU_SERIES
        for labels, value in series:
            entry = table.get(labels.get("__name__", ""))
            text = labels.get("gpu")
            index = _INDEX.get(text) if text is not None else None
            if index is None:
                index = _int(text)
            if index is None or entry is None:
                continue
            n = node(labels)
            if n is None or n.name in skip:
                continue
            key, scale, add, rank = entry
            if value >= DCGM_INT32_BLANK and rank >= 0 and _dcgm_blank(key, value):
                continue  # DCGM's "not supported" leaking through the exporter
            text = labels.get("GPU_I_ID")
            gi = None if text is None else _int(text)
            gpus = n.gpus
            if learn is not None and n.name in detail and n.name not in self._matchers:
                self._learn_matcher(n.name, learn, labels)
            wrote.add(n.name)
            values = gpus.get(index)
            if values is None:
                values = gpus[index] = {}
            if gi is not None:  # one MIG instance of the GPU
                values = n.mig.setdefault(index, {}).setdefault(gi, {})
                profile = labels.get("GPU_I_PROFILE")
                if profile and profile != "<<<NULL>>>":
                    values["profile"] = profile
            if add:
                values[key] = values.get(key, 0.0) + value * scale
            elif key not in values:
                values[key] = value * scale
                if rank:  # kept only where not 0, the rank of most names
                    ranks[(n.name, index, gi, key)] = rank
            else:
                # Of several names for one value, the table's first present wins (one
                # written with no rank kept, of rank 0 or by an earlier answer, as 0).
                slot = (n.name, index, gi, key)
                if rank <= ranks.get(slot, 0):
                    values[key] = value * scale
                    ranks[slot] = rank
        return wrote

    def _learn_matcher(self, name: str, resolver: NodeNames, labels: dict[str, str]) -> None:
        _learn(self._matchers.setdefault(name, set()), resolver, labels)

    def _read_inventory(self, resolver: NodeNames) -> dict[str, _Kept]:
        """The kept inventory's answers, by node."""
        kept: dict[str, _Kept] = {}
        node = _namer(resolver, kept, _Kept)
        a = self._inventory_answers
        # The total made from used + free first: an exporter's own total, after, wins.
        for answer in q.TOTALS:
            self._gpus(a.get(answer, []), node)
        # What each GPU is: its UUID, model and bus id; and the label matchers that
        # select the node's series.
        for labels, _ in a.get("gpu_info", []):
            index = _int(labels.get("gpu"))
            n = node(labels) if index is not None else None
            if n is None or index is None:
                continue
            _learn(n.matchers, resolver, labels)
            info = n.gpu_info.setdefault(index, {})
            info.setdefault("uuid", labels.get("uuid") or labels.get("UUID"))
            info.setdefault("name", labels.get("modelName") or labels.get("name"))
            info.setdefault("pci_bus_id", labels.get("pci_bus_id"))
        for labels, _ in a.get("gpu_drawn", []):
            index = _int(labels.get("gpu"))
            n = node(labels) if index is not None else None
            if n is not None and index is not None:
                n.drawn.add(index)
        for labels, _ in a.get("gpu_exported", []):
            entry = q.GPU_SERIES.get(labels.get("__name__", ""))
            n = node(labels) if entry is not None else None
            if n is not None and entry is not None:
                n.exported.add(entry[0])
        for labels, value in a.get("port_rate", []):
            n = node(labels)
            if n is not None:
                n.port_rates[f"{labels.get('device')}:{labels.get('port')}"] = value
        return kept

    def _apply_kept(self, n: _Node, kept: _Kept, detailed: bool) -> None:
        if kept.fresh:  # a GPU with series asked now is gone when they are
            kept.fresh = False
            unasked = q.DRAWN_ONLY_GPU - self._dense
            kept.drawn -= {i for i, g in n.gpus.items()
                           if i in n.mig or not unasked.issuperset(g)}
        if not detailed and self._dense != q.DENSE_GPU:
            for index in kept.drawn:  # there, though no series this refresh asked says so
                n.gpus.setdefault(index, {})
        if not detailed:  # an open screen's node has all of it in the detail answer
            for index, values in kept.gpus.items():
                live = n.gpus.get(index)
                if live is not None:
                    live.update(values)
            for index, instances in kept.mig.items():
                live_mig = n.mig.get(index)
                if live_mig is None:
                    continue
                for gi, values in instances.items():
                    if gi in live_mig:
                        live_mig[gi].update(values)
        for index, info in kept.gpu_info.items():
            if index in n.gpus:
                n.gpu_info.setdefault(index, info)
        if kept.matchers:
            known = self._matchers.setdefault(n.name, set())
            for matcher in kept.matchers:
                if len(known) < MAX_MATCHERS:
                    known.add(matcher)
        # The health counters its exporters export, at 0 on the GPUs the sparse answer
        # left out: the rules that count their increase need the zero they start from
        # (the first XID-free NVLink error is an increase of one, not a new counter).
        for key in kept.exported:
            for values in n.gpus.values():
                values.setdefault(key, 0.0)
        for pid, rate in kept.port_rates.items():
            port = n.ports.get(pid)
            if port is not None:
                port["rate"] = rate

    def _ports(self, a: dict[str, Series],
               node: Callable[[dict[str, str]], _Node | None]) -> None:
        def port(labels: dict[str, str]) -> dict[str, Any] | None:
            if not labels.get("device") or not labels.get("port"):
                return None
            n = node(labels)
            if n is None:
                return None
            pid = f"{labels['device']}:{labels['port']}"
            p = n.ports.get(pid)
            if p is None:
                p = n.ports[pid] = {"id": pid}
            return p

        for labels, value in [*a.get("port_state", []), *a.get("port_phys_state", [])]:
            key = q.PORT_GAUGES.get(labels.get("__name__", ""))
            p = port(labels) if key else None
            if p is not None and key:
                p[key] = value
        for answer, key in (("ib_tx", "tx_bytes_s"), ("ib_rx", "rx_bytes_s"),
                            ("ib_wait", "xmit_wait_s")):
            for labels, value in a.get(answer, []):
                p = port(labels)
                if p is not None:
                    p[key] = value
        for labels, value in a.get("ib_errors", []):  # a port's counters, where not 0
            name = labels.get("__name__", "")
            if name == PORT_UNREADABLE_METRIC:  # our agent could not read this one
                kind = labels.get("counter", "")
                p = port(labels) if kind in PORT_ERROR_COUNTERS else None
                if p is not None:  # NaN: not known, where no other series says
                    p.setdefault(_ERRORS_OURS, {}).setdefault(kind, math.nan)
                continue
            entry = q.PORT_ERROR_SERIES.get(name)
            read = q.PORT_READ_SERIES.get(name)
            p = port(labels) if entry is not None or read is not None else None
            if p is None:
                continue
            # Both exporters on one node: ours, as for every other value.
            ours = entry[1] if entry is not None else bool(read)
            counters = p.setdefault(_ERRORS_OURS if ours else _ERRORS_NODE, {})
            if entry is None:
                counters[_READ] = value  # the port's state: its counters were read
            else:  # two series of one counter (two jobs scrape it): the higher
                counters[entry[0]] = max(value, counters.get(entry[0], value))

    def _storage(self, a: dict[str, Series],
                 node: Callable[[dict[str, str]], _Node | None]) -> None:
        # node_exporter's mountstats name an NFS mount by its export; the mount point and
        # the type (nfs or nfs4) come from mountpoint_info or node_filesystem.
        mounts: dict[tuple[str | None, str], tuple[str, str | None]] = {}
        for labels, _ in a.get("nfs_mounts", []):
            if labels.get("export") and labels.get("mountpoint"):
                mount_key = (labels.get("instance"), labels["export"])
                mounts.setdefault(mount_key, (labels["mountpoint"], None))
        capacity: dict[tuple[str | None, str], dict[str, Any]] = {}
        for answer, key in (("fs_size", "size"), ("fs_avail", "avail")):
            for labels, value in a.get(answer, []):
                mp, device = labels.get("mountpoint"), labels.get("device")
                if not mp:
                    continue
                entry = capacity.setdefault((labels.get("instance"), mp), {
                    "fstype": labels.get("fstype"), "labels": labels})
                entry[key] = value
                if device:
                    old = mounts.get((labels.get("instance"), device))
                    mounts[(labels.get("instance"), device)] = (
                        old[0] if old else mp, labels.get("fstype"))
        for answer, key in (("fs_read", "read_bytes_s"), ("fs_write", "write_bytes_s")):
            for labels, value in a.get(answer, []):
                mount = labels.get("mount")
                fstype = labels.get("fstype")
                export = labels.get("export")
                if not mount and export:
                    mount, fstype = mounts.get((labels.get("instance"), export),
                                               (export, None))
                if not mount:
                    continue
                n = node(labels)
                if n is None:
                    continue
                fs = n.filesystems.setdefault(mount, {"id": mount,
                                                      "fstype": fstype or "nfs"})
                if fstype:
                    fs["fstype"] = fstype
                if export:
                    fs["source"] = export
                fs[key] = fs.get(key, 0.0) + value  # tcp and udp transports of one mount
        for (_, mp), entry in capacity.items():
            n = node(entry["labels"])
            if n is None:
                continue
            fs = n.filesystems.setdefault(mp, {"id": mp, "fstype": entry["fstype"] or "-"})
            fs["fstype"] = entry["fstype"] or fs["fstype"]
            if entry.get("size") is not None:
                fs["size"] = _whole(entry["size"])
            if entry.get("avail") is not None:
                fs["avail"] = _whole(entry["avail"])
        for answer, key in (("disk_read", "read_bytes_s"), ("disk_write", "write_bytes_s")):
            for labels, value in a.get(answer, []):
                if labels.get("device"):
                    n = node(labels)
                    if n is not None:
                        n.disks.setdefault(labels["device"], {"id": labels["device"],
                                                              "kind": "disk"})[key] = value

    # -- nodes to frames ------------------------------------------------------------

    def _emit(self, name: str, n: _Node, ts: float, worlds: dict[str, int]) -> None:
        indices = sorted(n.gpus)
        facts = []  # each GPU's index, inventory and values: its GpuInfo where it changed
        gpus = []
        for i in indices:
            # A copy: the node stays as the server gave it, to compare with the next.
            raw = _mig_parent(n.gpus[i], n.mig[i]) if i in n.mig else dict(n.gpus[i])
            info = n.gpu_info.get(i, {})
            if "mem_total" not in raw and "_fb_free" in raw and "mem_used" in raw:
                raw["mem_total"] = raw["mem_used"] + raw["_fb_free"] + raw.get(
                    "mem_reserved", 0)
            if "_throttle_bits" in raw and "clock_events" not in raw:
                bits = int(raw["_throttle_bits"])
                raw["clock_events"] = [v for b, v in q.THROTTLE_BITS.items() if bits & b]
            if raw.get("last_xid") == 0:
                raw["last_xid"] = None  # dcgm-exporter's 0 is "no XID"
            gpu = {k: _as(_GPU_KIND[k], v) for k, v in raw.items() if k in _GPU_KIND}
            if raw.get("_up") == 0:
                gpu = {"failed": "reported down by the agent (tuimon_gpu_up = 0)"}
            gpus.append(gpu)
            facts.append((i, info, raw))
        ports = []
        for p in n.ports.values():
            rate = p.get("rate")
            out = {k: v for k, v in p.items() if k != "phys_state" or v is not None}
            for side in ("tx", "rx"):
                util = link_util(p.get(f"{side}_bytes_s"), rate)
                if util is not None:  # at most 1, as the agent says it
                    out[f"{side}_util"] = util
            for k, names in (("state", PORT_STATES), ("phys_state", PORT_PHYS_STATES)):
                if k in out:  # named as the agent names it from sysfs
                    out[k] = int(out[k])
                    out.setdefault(f"{k}_name", names.get(out[k], str(out[k])))
            out.pop("rate", None)
            ports.append(out)
        inventory = (tuple((i, info.get("uuid"), info.get("name"), raw.get("power_limit"),
                            raw.get("_max_sm_clock")) for i, info, raw in facts),
                     tuple(sorted((pid, p.get("rate")) for pid, p in n.ports.items())),
                     tuple(sorted((f["id"], f["fstype"]) for f in n.filesystems.values())),
                     tuple(sorted(n.disks)))
        target = name
        if self._inventory.get(target) != inventory:
            self._inventory[target] = inventory
            gpus_info = [GpuInfo(index=i, uuid=info.get("uuid"), name=info.get("name"),
                                 mem_total=_as(_GPU_KIND["mem_total"], raw.get("mem_total")),
                                 power_limit=raw.get("power_limit"),
                                 pci_bus_id=info.get("pci_bus_id"),
                                 max_sm_clock=raw.get("_max_sm_clock"), max_mem_clock=None)
                         for i, info, raw in facts]
            hello = Hello(node=name, agent_version=f"prometheus via tuimon {__version__}",
                          boot_id=None, interval=self.options.every, ts=ts, gpus=gpus_info,
                          families=["gpu", "host", "fabric", "storage", "steps"],
                          # No GPU series is not a failure: the host may have none.
                          gpu_status=None,
                          extra={"ports": [{"id": p["id"], "rate": p.get("rate")}
                                           for p in n.ports.values()],
                                 "filesystems": [{"id": f["id"], "fstype": f["fstype"],
                                                  "source": f.get("source")}
                                                 for f in n.filesystems.values()],
                                 "disks": [{"id": d, "kind": "disk"} for d in n.disks]})
            self._deliver(target, hello)
        self._seq += 1
        extra: dict[str, Any] = {}
        if ports:
            extra["fabric"] = {"ports": ports, "nics": []}
        if n.filesystems or n.disks:
            # Copies: the check cleans a hostile name in place, and the node is kept as
            # the server gave it, to compare with the next (_unchanged).
            extra["storage"] = {"filesystems": [dict(f) for f in n.filesystems.values()],
                                "disks": [dict(d) for d in n.disks.values()]}
        if n.jobs:
            carry = self._step_carry.get(name, {})
            kept: dict[tuple[str, int], float] = {}
            extra["steps"] = {"jobs": [
                {"id": job, "world": worlds.get(job, 1),
                 "ranks": self._ranks(job, ranks, carry, kept),
                 **self._windows(name, job, ranks, ts)}
                for job, ranks in n.jobs.items()], "received": 0, "rejected": 0}
            self._step_carry[name] = kept
        host = {k: _as(_HOST_KIND[k], v) for k, v in n.host.items() if k in _HOST_KIND}
        sample = Sample(seq=self._seq, ts=ts, interval=self.options.every, gpus=gpus,
                        host=host, extra=extra)
        self._deliver(target, sample)

    def _ranks(self, job: str, ranks: dict[int, dict[str, float]],
               carry: dict[tuple[str, int], float], kept: dict[tuple[str, int], float]
               ) -> list[dict[str, Any]]:
        """The ranks' sums since the last refresh, from their rates: whole steps (the
        fraction carried to the next refresh) and the time those steps took, so that a
        rank's compute per step is its counters' (compute rate over step rate), not a
        second's compute over a step rounded up: 0.67 s where a step computes 1.40 s.
        A rank without a step counter is credited the time since the last refresh as one
        step."""
        dt = self._gap
        out = []
        for r, v in sorted(ranks.items()):
            if v.get("wall", 0.0) <= 0:
                continue
            rate = v.get("steps", 0.0)
            if rate > 0:
                counted = carry.get((job, r), 0.0) + rate * dt
                steps = min(int(counted), 1 << 30)
                kept[(job, r)] = counted - steps
                # Less than a step since: its time comes with the next (the rank still
                # reports, and its node still speaks for the job's windows).
                span = steps / rate
            else:
                steps, span = 1, dt
            out.append({"rank": r, "steps": steps, "wall": v["wall"] * span,
                        "compute": min(v.get("compute", 0.0), v["wall"]) * span,
                        "samples": _whole(v.get("samples", 0.0) * span),
                        "waits": {k[5:]: w * span for k, w in v.items()
                                  if k.startswith("wait:")}})
        return out

    def _windows(self, name: str, job: str, ranks: dict[int, dict[str, float]],
                 now: float) -> dict[str, Any]:
        """The node's `windows` of the job and its `drop`, as its agent sends them: the
        last minute from the live rates over [1m] (taken as the whole minute), the last
        hour from JOB_HOUR (covering the run time its ranks counted in it), once read;
        the drop judged from both."""
        at = self._job_hours_at
        if not ranks or at is None or \
                time.monotonic() - at > HOUR_FRESH_EVERY * self.options.budget_every:
            return {}  # no hour known lately: no windows, the viewer judges its own
        minute: dict[str, Any] = {"s": SHORT_S, "covered": SHORT_S, "wall": 0.0,
                                  "compute": 0.0, "samples": 0, "waits": {}}
        for v in ranks.values():
            wall = v.get("wall", 0.0) * SHORT_S
            minute["wall"] += wall
            minute["compute"] += min(v.get("compute", 0.0) * SHORT_S, wall)
            minute["samples"] += _whole(v.get("samples", 0.0) * SHORT_S) or 0
            for k, w in v.items():
                if k.startswith("wait:"):
                    minute["waits"][k[5:]] = minute["waits"].get(k[5:], 0.0) + w * SHORT_S
        hour = self._job_hours.get(name, {}).get(job)
        if hour is None:  # too young for an increase over the hour: the viewer judges
            return {}
        wall = max(0.0, hour.get("wall", 0.0))
        long = {"s": LONG_S, "covered": min(LONG_S, wall / len(ranks)), "wall": wall,
                "compute": min(max(0.0, hour.get("compute", 0.0)), wall),
                "samples": _whole(max(0.0, hour.get("samples", 0.0))) or 0,
                "waits": {k: w for k, w in hour["waits"].items() if w > 0}}
        judge = self._drops.get((name, job))
        if judge is None:
            judge = self._drops[(name, job)] = DropJudge()
        drop = judge_windows(judge, minute, long, now)
        return {"windows": [minute, long], **({"drop": drop} if drop else {})}

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


_N = TypeVar("_N", bound=_Node)


def _namer(resolver: NodeNames, into: dict[str, _N], make: Callable[[str], _N],
           most: int | None = None, known: Collection[str] = (),
           over: set[str] | None = None) -> Callable[[dict[str, str]], _N | None]:
    """A series' node in `into`, made when a series first names it. Asked once per
    series (a quarter of a million a refresh at 4096 nodes): by the identity labels'
    values, the node found for them before. With `most`: a name not `known` before is
    made only while the known and the new together are fewer; the others go to
    `over` (at most `most` of them are remembered)."""
    ids = resolver.identity
    found: dict[tuple[str | None, ...], _N | None] = {}
    new = [0]

    def node(labels: dict[str, str]) -> _N | None:
        key = tuple(map(labels.get, ids))
        try:
            return found[key]
        except KeyError:
            pass
        name = resolver.of(labels)
        n = None if name is None else into.get(name)
        if name is not None and n is None:
            if most is not None and name not in known:
                if len(known) + new[0] >= most:
                    if over is not None and len(over) < most:
                        over.add(name)
                    found[key] = None
                    return None
                new[0] += 1
            n = into[name] = make(name)
        found[key] = n
        return n
    return node


# A port's error counters while its node is assembled, by exporter (prometheus._ports).
_ERRORS_OURS = "_errors_tuimon"
_ERRORS_NODE = "_errors_node_exporter"
_READ = "_read"  # among a port's counters: they were read (its state answered), its state


def _state_read(port: dict[str, Any]) -> float | None:
    """A port's state as the last read of its counters found it (our agent's first, as
    everywhere: both exporters on one node); None where they were not read."""
    for key in (_ERRORS_OURS, _ERRORS_NODE):
        state = port.get(key, {}).get(_READ)
        if state is not None:
            return state
    return None


# The longest a --recorded refresh finds the records as they were before it reads them
# anyway (the rules' longest interval): records that stopped being evaluated hold the
# failed scrapes, the file systems and the jobs no longer than this.
STAND_MAX_S = live_rules.EVERY_S[1]
# How long a node absent from the answers keeps its ports' error counters as last read.
PORT_ERRORS_KEPT_S = 600.0

# The label matchers kept per node for its screen's detail query: an agent and an
# exporter, say; a few at most.
MAX_MATCHERS = 4


def _learn(known: set[str], resolver: NodeNames, labels: dict[str, str]) -> None:
    if len(known) < MAX_MATCHERS:
        matcher = resolver.matcher(labels)
        if matcher is not None:
            known.add(matcher)


_ACTIVITY = ("gr_active", "sm_active", "tensor_active", "dram_active")
# Values each MIG instance repeats for the whole GPU: taken once.
_WHOLE_GPU = ("power", "power_limit", "energy", "temp", "sm_clock", "mem_clock", "pstate",
              "last_xid", "_throttle_bits", "ecc_corrected", "ecc_uncorrected",
              "remapped_rows", "remap_failed", "remap_pending")
_SLICES = re.compile(r"(\d+)g\.")


def _mig_parent(raw: dict[str, Any], instances: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """A GPU in MIG mode from its instances' series: memory summed, the whole GPU's values
    once, activity weighted by each instance's share of the GPU (its slices)."""
    out = dict(raw)
    out["mig_mode"] = 1
    mig = []
    weights = 0.0
    activity: dict[str, float] = {}
    used: float | None = None  # None: no instance's memory used was asked
    total = 0.0
    for gi, v in sorted(instances.items()):
        match = _SLICES.match(v.get("profile") or "")
        slices = float(match.group(1)) if match else 1.0
        inst_used = v.get("mem_used")
        inst_total = v.get("mem_total")
        if inst_total is None and inst_used is not None and v.get("_fb_free") is not None:
            inst_total = inst_used + v["_fb_free"] + v.get("mem_reserved", 0.0)
        if inst_used is not None:
            used = (used or 0.0) + inst_used
        total += inst_total or 0.0
        entry = {"gi": gi, "ci": None, "profile": v.get("profile"),
                 "mem_used": _whole(inst_used), "mem_total": _whole(inst_total)}
        for key in _ACTIVITY:
            if v.get(key) is not None:
                entry[key] = v[key]
                activity[key] = activity.get(key, 0.0) + v[key] * slices
        weights += slices
        mig.append(entry)
        for key in _WHOLE_GPU:
            if v.get(key) is not None:
                out[key] = max(out.get(key, v[key]), v[key])
    out["mig"] = mig
    if used is not None:
        out["mem_used"] = used
    if total:
        out["mem_total"] = max(total, out.get("mem_total") or 0.0)
    if used is not None or total:
        out.pop("_fb_free", None)
    for key, weighted in activity.items():
        out.setdefault(key, weighted / weights)
    return out


def _merge(into: _Node, other: _Node) -> None:
    for index, values in other.gpus.items():
        into.gpus.setdefault(index, {}).update(values)
    for index, info in other.gpu_info.items():
        into.gpu_info.setdefault(index, info)
    for index, instances in other.mig.items():
        into.mig.setdefault(index, {}).update(instances)
    # A port both name: its values from each (one exporter's state, the other's counters).
    for pid, port in other.ports.items():
        into.ports[pid] = {**port, **into.ports.get(pid, {})}
    for attr in ("host", "filesystems", "disks", "jobs"):
        getattr(into, attr).update({k: v for k, v in getattr(other, attr).items()
                                    if k not in getattr(into, attr)})
    into.present = into.present or other.present


def _budget(a: dict[str, Series], window_hours: float) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}

    def entry(labels: dict[str, str]) -> dict[str, Any] | None:
        job = labels.get("exported_job") or labels.get("job")
        if not job:
            return None
        return out.setdefault(job, {"window_h": window_hours, "error_ratio": {},
                                    "source": "prometheus"})

    for labels, value in a.get("budget_total", []):
        e = entry(labels)
        if e is not None:
            e["observed_h"] = value
    for labels, value in a.get("budget_effective", []):
        e = entry(labels)
        if e is not None and "observed_h" in e:
            e["consumed_h"] = max(0.0, e["observed_h"] - value)
    for labels, value in a.get("budget_waits", []):
        e = entry(labels)
        kind = labels.get("kind")
        if e is not None and kind and value > 0:
            spent = e.setdefault("spent_h", {})
            spent[rank_kind(kind)] = spent.get(rank_kind(kind), 0.0) + value
    for e in out.values():  # as the ledger: shares of the hours lost, the rest `other`
        if "consumed_h" in e:
            e["spent_h"] = split_wait(e.get("spent_h"), e["consumed_h"])
    for w in BURN_WINDOWS_S:
        for labels, value in a.get(f"ratio_{w}", []):
            e = entry(labels)
            if e is not None:
                e["error_ratio"][w] = min(1.0, max(0.0, value))
    return out


# Each node's last hour (JOB_HOUR) stands for this many budget intervals after its read;
# older (its queries failing since), no node's windows are sent.
HOUR_FRESH_EVERY = 3

# A GPU's index as its label writes it, read without int() for the usual ones.
_INDEX = {str(i): i for i in range(1024)}


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


# DCGM marks a value it has not (blank, not found, not supported, no permission) with
# numbers from these up (dcgm_structs.h DCGM_INT64_BLANK, DCGM_INT32_BLANK), and
# dcgm-exporter writes them as they are: 9223372036854775794 is "not supported".
DCGM_INT64_BLANK = 0x7FFFFFFFFFFFFFF0
DCGM_INT32_BLANK = 0x7FFFFFF0
# Fields DCGM keeps in 32 bits (a link's generation or width, a state): for these the
# 32-bit marks apply too.
_SMALL_FIELDS = frozenset(f.key for f in GPU_FIELDS if isinstance(f.type, Int)
                          and f.type.hi is not None and f.type.hi < DCGM_INT32_BLANK)


def _dcgm_blank(key: str, value: float) -> bool:
    return value >= DCGM_INT64_BLANK or (key in _SMALL_FIELDS and value >= DCGM_INT32_BLANK)


def _as(kind: WireType, v: Any) -> Any:
    """A series' value as its field holds it: a whole number for an Int, and nil for
    what the field cannot hold (a count past 2^64, an infinite rate): one exporter's odd
    value is that value's, not the refresh's."""
    if v is None:
        return None
    if isinstance(kind, Int) and isinstance(v, float):
        v = _whole(v)
    return None if v is None else kind.fit(v)


def _whole(v: float | None) -> int | None:
    """A count from a float series: nil where it is none (negative, past 2^63, NaN)."""
    return round(v) if v is not None and 0 <= v < 2.0 ** 63 else None


@contextlib.asynccontextmanager
async def prom_watching(url: str, cluster: ClusterState,
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
