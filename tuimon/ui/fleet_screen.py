"""The fleet screen (`i`): what the nodes are made of, each aspect with its nodes grouped
by value, the most common first (tuimon_core.fleet decides the groups; this draws them)."""

from __future__ import annotations

from textual.binding import Binding

from tuimon.model.cluster import ClusterState
from tuimon.text.markup import safe
from tuimon.ui.text_screen import TextScreen
from tuimon_core.fleet import fleet_table, hellos_of
from tuimon_core.hostlist import collect_hostlist

SHOWN_GROUPS = 6  # per aspect; the rest are counted


class FleetScreen(TextScreen):
    BINDINGS = [Binding("escape,i,q", "app.pop_screen", "close", id="close_fleet")]

    def __init__(self, cluster: ClusterState,
                 cpu_nodes: frozenset[str] = frozenset()) -> None:
        super().__init__()
        self.cluster = cluster
        self.cpu_nodes = cpu_nodes

    def text(self) -> str:
        hellos = hellos_of(((n.name, n.hello) for n in self.cluster.nodes.values()),
                           self.cpu_nodes)
        lines = [f"[b]fleet[/b]  what {len(hellos)} nodes say they are made of; the few "
                 "that differ from most are also in the diagnosis"]
        left_out = self.cpu_nodes & self.cluster.nodes.keys()
        if left_out:
            lines.append(f"  CPU nodes left out: {safe(collect_hostlist(left_out), 80)}")
        for aspect, model, groups in fleet_table(hellos):
            total = sum(len(g.nodes) for g in groups)
            title = aspect.label + (f" ({safe(model, 40)})" if model else "")
            odd = len(groups) > 1
            lines.append(f"[b]{title}[/b]" + ("  [$warning]differs[/]" if odd else ""))
            for g in groups[:SHOWN_GROUPS]:
                names = "all" if len(g.nodes) == total else safe(
                    collect_hostlist(g.nodes), 80)
                lines.append(f"  {safe(aspect.show(g.value), 40):<28} {len(g.nodes):>6}  "
                             f"{names}")
            if len(groups) > SHOWN_GROUPS:
                lines.append(f"  ... and {len(groups) - SHOWN_GROUPS} more values")
        if len(lines) == 1:
            lines.append("no node has said what it is made of yet (agents before 2026-12, "
                         "or Prometheus, do not)")
        lines.append("\n[$secondary]esc closes[/]")
        return "\n".join(lines)
