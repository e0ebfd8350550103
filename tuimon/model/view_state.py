"""Which nodes a view shows, in which order: filter, sort, topology groups.

Plain Python, so the app's behaviour (filter by regex, sort by metric, group by leaf)
is tested without a screen.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tuimon.model.cluster import ClusterState, NodeState
from tuimon.model.heat import NO_DATA, HeatMetric, node_level

SORTS = ("name", "metric")


class FilterError(ValueError):
    """A filter that is not a valid regular expression."""


@dataclass
class ViewState:
    filter_text: str = ""
    sort: str = "name"
    topology: dict[str, str] = field(default_factory=dict)  # node name -> leaf switch
    cpu_nodes: frozenset[str] = frozenset()  # known to have no GPU
    _pattern: re.Pattern[str] | None = None

    def set_filter(self, text: str) -> None:
        """Plain text matches as a substring; anything else as a regular expression."""
        text = text.strip()
        if not text:
            self.filter_text, self._pattern = "", None
            return
        try:
            pattern = re.compile(text, re.IGNORECASE)
        except re.error as exc:
            raise FilterError(f"bad filter {text!r}: {exc}") from None
        self.filter_text, self._pattern = text, pattern

    def visible(self, cluster: ClusterState, metric: HeatMetric | None = None) -> list[NodeState]:
        nodes = [n for n in cluster.nodes.values()
                 if self._pattern is None or self._pattern.search(n.name)]
        if self.sort == "metric" and metric is not None:
            def key(n: NodeState) -> tuple[int, str]:
                infos = n.hello.gpus if n.hello else []
                level = node_level(metric, n.gpu_values(), infos)
                return (-(level if level != NO_DATA else -3), n.name)
            return sorted(nodes, key=key)
        return sorted(nodes, key=lambda n: n.name)

    def groups(self, nodes: list[NodeState]) -> list[tuple[str, list[NodeState]]]:
        """Nodes grouped by leaf switch when the topology is known, in leaf order."""
        if not self.topology:
            return [("", nodes)]
        out: dict[str, list[NodeState]] = {}
        for n in nodes:
            out.setdefault(self.topology.get(n.name, "unknown leaf"), []).append(n)
        return sorted(out.items())


def parse_topology_conf(text: str) -> dict[str, str]:
    """Slurm topology.conf: `SwitchName=leaf1 Nodes=gpu[001-016]` lines -> node -> leaf."""
    from tuimon_core.hostlist import MAX_TARGETS, expand_hostlist

    out: dict[str, str] = {}
    budget = MAX_TARGETS  # names in the whole file, each list counted before expanding
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
        switch, nodes = fields.get("SwitchName"), fields.get("Nodes")
        if switch and nodes:
            names = expand_hostlist(nodes, budget)
            budget -= len(names)
            for name in names:
                out[name] = switch
    return out
