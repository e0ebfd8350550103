"""A relay's history, read over HTTP (`GET /v1/history`): the incidents its judgement
held, from its ledger. For `tuimon status --since` and the app's history screen; the
same token and TLS as the stream."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from tuimon.sources.agent_stream import StreamOptions
from tuimon_core.protocol.text import clean_tree

MAX_HISTORY_BYTES = 32 << 20


class HistoryError(Exception):
    """The relay could not say its history; the message says why."""


async def read_history(relay: str, options: StreamOptions, *, since: float | None = None,
                       start: float | None = None, until: float | None = None,
                       job: str | None = None) -> dict[str, Any]:
    """The relay's incidents over the last `since` seconds (or from `start` to `until`,
    Unix time): its answer, every string cleaned."""
    params: dict[str, str] = {}
    if since is not None:
        params["since"] = repr(float(since))
    if start is not None:
        params["from"] = repr(float(start))
    if until is not None:
        params["until"] = repr(float(until))
    if job:
        params["job"] = job
    scheme = "https" if options.ssl_context else "http"
    headers = {"Authorization": f"Bearer {options.token}"} if options.token else {}
    try:
        async with aiohttp.ClientSession() as http, http.get(
                f"{scheme}://{relay}/v1/history", params=params, headers=headers,
                ssl=options.ssl_context or True,
                timeout=aiohttp.ClientTimeout(total=15)) as resp:
            if resp.status == 401:
                raise HistoryError(f"relay {relay}: wrong or missing token (401)")
            if resp.status == 404:
                raise HistoryError(f"relay {relay}: keeps no history (no ledger, or a relay "
                                   "older than the history)")
            if resp.status != 200:
                raise HistoryError(f"relay {relay}: HTTP {resp.status}")
            body = await resp.content.read(MAX_HISTORY_BYTES + 1)
            if len(body) > MAX_HISTORY_BYTES:
                raise HistoryError(f"relay {relay}: a history over "
                                   f"{MAX_HISTORY_BYTES >> 20} MiB: ask a shorter range")
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        raise HistoryError(f"relay {relay}: {type(exc).__name__}: {exc}") from None
    try:
        doc = json.loads(body)
    except ValueError:
        raise HistoryError(f"relay {relay}: its history is not JSON") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("incidents"), list):
        raise HistoryError(f"relay {relay}: its history has no incidents list")
    incidents = [i for i in doc["incidents"] if _sound(i)]
    return clean_tree({"relay": doc.get("relay"), "incidents": incidents})


def _sound(item: Any) -> bool:
    """An incident as the relay writes it (anything else from the network is skipped)."""
    return (isinstance(item, dict) and isinstance(item.get("onset"), (int, float))
            and isinstance(item.get("ended"), (int, float, type(None)))
            and isinstance(item.get("kind"), str) and isinstance(item.get("where"), str)
            and isinstance(item.get("severity"), str)
            and isinstance(item.get("message"), str)
            and isinstance(item.get("lost_h"), (int, float))
            and isinstance(item.get("flaps"), int)
            and isinstance(item.get("jobs"), list))
