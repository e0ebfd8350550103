"""Findings grouped for people: one line per node when a node has several of a kind
(three GPUs straggling on gpu012), one line for many nodes with the same fault ("17
nodes lost: gpu[001-017]"), worst first. The views and `tuimon status` show groups;
each keeps its findings so a view can open the node behind one."""

from __future__ import annotations

from dataclasses import dataclass, field

from tuimon_core.findings import KINDS, NO_KIND, SEVERITY_ORDER, Finding, sort_key
from tuimon_core.hostlist import collect_hostlist

MANY = 3  # this many nodes with the same kind of fault make one line


@dataclass
class FindingGroup:
    severity: str
    kind: str
    text: str
    findings: list[Finding] = field(default_factory=list)

    @property
    def nodes(self) -> list[str]:
        out: list[str] = []
        for f in self.findings:
            for name in (f.node, *f.nodes):
                if name and name not in out:
                    out.append(name)
        return out

    @property
    def since(self) -> float | None:
        """When the earliest of its findings began (Unix time), where known."""
        return min((f.first_seen for f in self.findings if f.first_seen is not None),
                   default=None)

    @property
    def leaf(self) -> str | None:
        return next((f.leaf for f in self.findings if f.leaf and f.leaf != "spine"), None)


def _part(f: Finding) -> str | None:
    if f.gpu is not None:
        return f"GPU {f.gpu}"
    return f.port


def group(findings: list[Finding]) -> list[FindingGroup]:
    by_kind: dict[tuple[str, str], list[Finding]] = {}
    for f in findings:
        by_kind.setdefault((f.severity, f.kind), []).append(f)
    out: list[FindingGroup] = []
    for (severity, kind), items in by_kind.items():
        by_node: dict[str | None, list[Finding]] = {}
        for f in items:
            by_node.setdefault(f.node, []).append(f)
        single = [fs for node, fs in by_node.items() if node is not None]
        if len(single) >= MANY and all(len(fs) == 1 and not fs[0].nodes for fs in single):
            # Many nodes, one finding each: one line naming them as a host list.
            members = [fs[0] for fs in single]
            names = collect_hostlist(sorted(f.node or "" for f in members))
            word = KINDS.get(kind, NO_KIND).many or kind.replace("_", " ")
            text = f"{len(members)} {word}: {names} (e.g. {members[0].message})"
            out.append(FindingGroup(severity, kind, text, members))
            single_nodes = {f.node for f in members}
            rest = [f for f in items if f.node not in single_nodes]
        else:
            rest = []
            for node, fs in by_node.items():
                if node is not None and len(fs) > 1:
                    fs.sort(key=sort_key)
                    parts = [p for p in (_part(f) for f in fs) if p]
                    more = f" (+{len(fs) - 1} more: {', '.join(parts[1:])})" if parts[1:] \
                        else f" (+{len(fs) - 1} more)"
                    out.append(FindingGroup(severity, kind, fs[0].message + more, fs))
                else:
                    rest.extend(fs)
        out.extend(FindingGroup(severity, kind, f.message, [f]) for f in rest)
    out.sort(key=lambda g: (SEVERITY_ORDER.get(g.severity, 3),
                            min((sort_key(f) for f in g.findings), default=())))
    return out
