"""A relay's history and a run's report, read over HTTP (`GET /v1/history`, `GET
/v1/report`): the incidents its judgement held and one job's report, from its ledger. For
`tuimon status --since`, `tuimon report` and the app's history screen; the same token and
TLS as the stream."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from tuimon.sources.agent_stream import StreamOptions
from tuimon_core.protocol.text import clean, clean_tree

MAX_HISTORY_BYTES = 32 << 20
MAX_REASON = 300  # characters of a relay's reason for a 404 that are said


class HistoryError(Exception):
    """The relay could not say its history (or a report); the message says why."""


async def _get_json(relay: str, path: str, params: dict[str, str], options: StreamOptions,
                    what: str, older: str) -> dict[str, Any]:
    """A JSON object from the relay, every string cleaned. A 404 says the relay's own
    reason (no ledger, no such job) where it gave one; aiohttp's bare one, `older` (a
    relay that predates the endpoint)."""
    scheme = "https" if options.ssl_context else "http"
    headers = {"Authorization": f"Bearer {options.token}"} if options.token else {}
    try:
        async with aiohttp.ClientSession() as http, http.get(
                f"{scheme}://{relay}{path}", params=params, headers=headers,
                ssl=options.ssl_context or True,
                timeout=aiohttp.ClientTimeout(total=15)) as resp:
            if resp.status == 401:
                raise HistoryError(f"relay {relay}: wrong or missing token (401)")
            if resp.status == 404:
                reason = clean((await resp.content.read(MAX_REASON)).decode(
                    errors="replace").strip())
                raise HistoryError(f"relay {relay}: " + (
                    older if not reason or reason.startswith("404") else reason))
            if resp.status != 200:
                raise HistoryError(f"relay {relay}: HTTP {resp.status}")
            body = await resp.content.read(MAX_HISTORY_BYTES + 1)
            if len(body) > MAX_HISTORY_BYTES:
                raise HistoryError(f"relay {relay}: {what} over "
                                   f"{MAX_HISTORY_BYTES >> 20} MiB: ask a shorter range")
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        raise HistoryError(f"relay {relay}: {type(exc).__name__}: {exc}") from None
    try:
        doc = json.loads(body)
    except ValueError:
        raise HistoryError(f"relay {relay}: {what} is not JSON") from None
    if not isinstance(doc, dict):
        raise HistoryError(f"relay {relay}: {what} is not a JSON object")
    return clean_tree(doc)


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
    doc = await _get_json(relay, "/v1/history", params, options, "its history",
                          "keeps no history (no ledger, or a relay older than the history)")
    if not isinstance(doc.get("incidents"), list):
        raise HistoryError(f"relay {relay}: its history has no incidents list")
    return {"relay": doc.get("relay"), "incidents": [i for i in doc["incidents"] if sound(i)]}


async def read_report(relay: str, options: StreamOptions, job: str,
                      since: float | None = None) -> dict[str, Any]:
    """One job's report (`GET /v1/report`), every string cleaned; its incidents those
    that read as the relay writes them. What else it holds is checked where it is read
    (tuimon.model.run_report)."""
    params = {"job": job, **({"since": repr(float(since))} if since is not None else {})}
    doc = await _get_json(relay, "/v1/report", params, options, "its report",
                          "has no report (a relay older than `tuimon report`)")
    if isinstance(doc.get("incidents"), list):
        doc["incidents"] = [i for i in doc["incidents"] if sound(i)]
    return doc


def sound(item: Any) -> bool:
    """An incident as the relay writes it (anything else from the network is skipped)."""
    return (isinstance(item, dict) and isinstance(item.get("onset"), (int, float))
            and isinstance(item.get("ended"), (int, float, type(None)))
            and isinstance(item.get("kind"), str) and isinstance(item.get("where"), str)
            and isinstance(item.get("severity"), str)
            and isinstance(item.get("message"), str)
            and isinstance(item.get("lost_h"), (int, float))
            and isinstance(item.get("flaps"), int)
            and isinstance(item.get("jobs"), list))
