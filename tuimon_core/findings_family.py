"""Findings on the wire, both ways: the `findings` family of a sample (a node's rule
conditions), and a relay's judgement (a batch's `judgement`: what it holds, with the
true onsets).

A node judges itself (tuimon_core/node_rules.py) and sends what holds now; the reader's
own FindingBook adds the hold and the hysteresis, exactly as for conditions it judged
itself. The node is not sent: a reader names the node that sent it, so a node cannot
raise findings about another.
"""

from __future__ import annotations

from typing import Any

from tuimon_core.findings import MAX_HELD_S, Finding
from tuimon_core.hostlist import collect_hostlist, expand_hostlist
from tuimon_core.protocol.fields import FAMILY_TYPES, JUDGEMENT, MAX_JUDGED

_FINDINGS = FAMILY_TYPES["findings"]


def findings_to_wire(conditions: list[Finding]) -> list[dict[str, Any]]:
    """A node's rule conditions as the `findings` family: what holds now, fitted to the
    family's type (at most MAX_FINDINGS, each string within its bound)."""
    out = []
    for f in conditions:
        row: dict[str, Any] = {"severity": f.severity, "kind": f.kind, "message": f.message}
        if f.gpu is not None:
            row["gpu"] = f.gpu
        if f.port is not None:
            row["port"] = f.port
        if f.fs is not None:
            row["fs"] = f.fs
        if f.score:
            row["score"] = f.score
        if f.held_s > 0:
            row["held"] = min(f.held_s, MAX_HELD_S)
        out.append(row)
    return _FINDINGS.fit(out)


def findings_from_wire(rows: list[dict[str, Any]], node: str,
                       target: str | None = None) -> list[Finding]:
    """The conditions a node sent (already checked by the decoder), named after the node
    the reader knows it as: a node cannot raise findings about another. `target`: the
    address they came from, where the reader keeps it apart from the name (the relay)."""
    return [Finding(r["severity"], r["kind"], _said_by(r.get("message") or "", node), node=node,
                    gpu=r.get("gpu"), port=r.get("port"), fs=r.get("fs"),
                    score=float(r.get("score") or 0.0), target=target,
                    held_s=float(r.get("held") or 0.0))
            for r in rows]


def _said_by(message: str, node: str) -> str:
    """A node's own words begin with its name, as its agent writes them (`gpu012 GPU 3
    thermal ...`); text that begins otherwise (another node's name) is put under the
    name it came from, so a page's first words never speak for another node."""
    if message == node or message.startswith((f"{node} ", f"{node}:")):
        return message
    return f"{node}: {message}"


# -- a relay's judgement (a batch's `judgement`) ----------------------------------------

_JUDGEMENT = JUDGEMENT


def judgement_to_wire(findings: list[Finding], at: float) -> dict[str, Any]:
    """The findings a relay's judgement holds as the batch's `judgement`: each with its
    component by field and its true onset, the gravest first, fitted to the type (at
    most MAX_JUDGED; how many were left out said)."""
    rows = []
    for f in findings[:MAX_JUDGED]:
        row: dict[str, Any] = {"severity": f.severity, "kind": f.kind, "message": f.message,
                               "since": f.first_seen if f.first_seen is not None else at}
        for key in ("node", "gpu", "port", "fs", "leaf", "job", "target"):
            value = getattr(f, key)
            if value is not None:
                row[key] = value
        if f.nodes:
            row["nodes"] = collect_hostlist(f.nodes)
        if f.score:
            row["score"] = f.score
        row["held"] = max(0.0, at - row["since"])
        rows.append(row)
    out: dict[str, Any] = {"at": at, "findings": rows}
    if len(findings) > MAX_JUDGED:
        out["left_out"] = len(findings) - MAX_JUDGED
    return _JUDGEMENT.fit(out)


def findings_from_judgement(doc: dict[str, Any]) -> list[Finding]:
    """A relay's judgement (checked by the decoder) as findings, each with its onset
    (`first_seen`) as the relay saw it: shown as held, not held again."""
    out = []
    for r in doc["findings"]:
        nodes = tuple(expand_hostlist(r["nodes"])) if r.get("nodes") else ()
        out.append(Finding(r["severity"], r["kind"], r.get("message") or "",
                           node=r.get("node"), gpu=r.get("gpu"), port=r.get("port"),
                           leaf=r.get("leaf"), fs=r.get("fs"), job=r.get("job"),
                           target=r.get("target"), score=float(r.get("score") or 0.0),
                           nodes=nodes, first_seen=r["since"], last_seen=doc["at"]))
    return out
