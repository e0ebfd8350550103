"""The `findings` family of a sample, both ways: a node's rule conditions on the wire.

A node judges itself (tuimon_core/node_rules.py) and sends what holds now; the reader's
own FindingBook adds the hold and the hysteresis, exactly as for conditions it judged
itself. The node is not sent: a reader names the node that sent it, so a node cannot
raise findings about another.
"""

from __future__ import annotations

from typing import Any

from tuimon_core.findings import MAX_HELD_S, Finding
from tuimon_core.protocol.fields import FAMILY_TYPES

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
    return [Finding(r["severity"], r["kind"], r.get("message") or "", node=node,
                    gpu=r.get("gpu"), port=r.get("port"), fs=r.get("fs"),
                    score=float(r.get("score") or 0.0), target=target,
                    held_s=float(r.get("held") or 0.0))
            for r in rows]
