"""The HTTP side of reading Prometheus: one instant query or the targets list, with the
token, the tenant, TLS and a timeout, read within the bounds that keep a hostile or huge
answer from taking the viewer's memory (docs/security.md). Knows no query's meaning."""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from tuimon.sources.agent_stream import describe_error
from tuimon.sources.prom_answers import NotJson, Series, read_answer
from tuimon_core.protocol.text import clean

# Asked with every query: the newest samples, as they are. VictoriaMetrics otherwise moves
# a query for "now" 30 s back (-search.latencyOffset), so a new node shows half a minute
# late and every value is half a minute old; `nocache=1` keeps the time asked for. It
# also skips VictoriaMetrics' cache, the budget's queries over the SLO window included:
# without it a new job has no budget for half a minute, and they run every
# `budget_every` (30 s), not every refresh. Prometheus, Thanos and Mimir ignore
# parameters they do not know.
LIVE = {"nocache": "1"}

# Memory is bounded by what a refresh holds, whatever the server answers
# (docs/security.md): each answer at most MAX_ANSWER_BYTES read (after decompression),
# at most MAX_HELD_SERIES series decoded in one refresh (about a kilobyte each once
# read: counted in the bytes before they are decoded). Past either the refresh fails
# with the reason, every node stale. A node of 8 GPUs and 8 ports holds about 50 series
# (measured at 4096 nodes with --recorded: 204,800 in all, the inventory's included, which
# 200,000 refused): enough for about 5,000 such nodes; past that, --match (a shard each).
# Under answers naming 110,000 hosts the app's peak stays near 370 MiB (tests/test_bounds.py).
MAX_ANSWER_BYTES = 32 << 20
MAX_HELD_SERIES = 250_000


class PromError(Exception):
    """Prometheus could not answer; the message says which query and why."""


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


async def all_or_none(calls: list[Awaitable[Any]]) -> list[Any]:
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


class PromClient:
    """Queries one server, a few at a time (`concurrency`), each within `timeout`."""

    def __init__(self, url: str, session: aiohttp.ClientSession, *, token: str | None = None,
                 tenant: str | None = None, ssl_context: ssl.SSLContext | None = None,
                 timeout: float = 10.0, concurrency: int = 4, recorded: bool = False) -> None:
        self.url = url.rstrip("/")
        self.recorded = recorded  # reading records already: the bound's advice is --match
        self.session = session
        self.token = token
        self.tenant = tenant
        self.ssl_context = ssl_context
        self.timeout = timeout
        self.queries_run = 0
        self.bytes_read = 0  # answers' bytes as parsed (after decompression)
        # Called with (query name, answer bytes) for every answer read: how the
        # recorded answers under tests/fixtures were taken from a real server.
        self.tap: Callable[[str, bytes], None] | None = None
        # Series of the answers held, by query name (at most one answer a name is kept):
        # what bounds the memory answers take (_hold).
        self._held: dict[str, int] = {}
        self._held_total = 0
        self._sem = asyncio.Semaphore(concurrency)

    def _headers(self) -> dict[str, str]:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        if self.tenant:
            headers["X-Scope-OrgID"] = self.tenant
        return headers

    async def _get(self, path: str, params: dict[str, str]) -> tuple[int, bytes | bytearray]:
        try:
            async with self.session.get(
                    f"{self.url}{path}", params=params, headers=self._headers(),
                    ssl=self.ssl_context or True,
                    timeout=aiohttp.ClientTimeout(total=self.timeout)) as resp:
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

    def _hold(self, key: str, count: int) -> None:
        """Room for an answer of `count` series about to be decoded, in place of the
        last answer to `key` (what its query name holds): at most MAX_HELD_SERIES over
        every answer kept, counted in the bytes before any is decoded."""
        others = self._held_total - self._held.get(key, 0)
        if others + count > MAX_HELD_SERIES:
            advice = "(--match)" if self.recorded else "(--match) or read records (--recorded)"
            raise PromError(f"prometheus {self.url}: its answers name more than "
                            f"{MAX_HELD_SERIES} series together ({count} in {key[:60]}): "
                            f"refused; narrow the selection {advice}")
        self._held[key] = count
        self._held_total = others + count

    async def query(self, promql: str, name: str | None = None) -> Series:
        """One instant query at the server's now, as stored (LIVE); `name`: the query's
        name, under which its answer is held (the query itself where none is given)."""
        async with self._sem:
            self.queries_run += 1
            status, body = await self._get("/api/v1/query", {"query": promql, **LIVE})
            self._hold(name or promql, body.count(b'"metric"'))
        if self.tap is not None:
            self.tap(name or promql, bytes(body))
        try:
            parsed, samples = read_answer(body)
        except NotJson:
            raise PromError(f"prometheus {self.url}: HTTP {status}, not a JSON answer "
                            "(/api/v1/query)") from None
        if samples is None:
            error = parsed.get("error") if isinstance(parsed, dict) else None
            raise PromError(clean(f"prometheus {self.url}: query failed: "
                                  f"{str(error or parsed)[:200]} ({promql[:80]})"))
        return samples

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
