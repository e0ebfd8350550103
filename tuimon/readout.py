"""A plain-text readout of the cluster model, one table per refresh.

What `tuimon demo` and `tuimon connect` print until the full-screen app replaces it,
and what `--plain` keeps for logs and dumb terminals.
"""

from __future__ import annotations

import time

from tuimon.model.cluster import ClusterState
from tuimon.model.judgement import Judgement
from tuimon.model.node_state import NodeState
from tuimon.status import format_text, report, verdict
from tuimon_core.findings import Finding
from tuimon_core.gpu_state import xids_seen
from tuimon_core.heat_levels import BUSY_FIELDS, gpu_busy
from tuimon_core.node_states import DOWN, STALE, UNKNOWN, UP
from tuimon_core.protocol.fields import port_down
from tuimon_core.protocol.row_access import host_row, port_rows
from tuimon_core.protocol.text import clean_lines


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


NAME_MIN, NAME_MAX = 20, 64  # the name column: as wide as the longest name, within these


def shown_name(name: str, width: int) -> str:
    """A node name whole where it fits; else its host part before the domain (a cloud
    name's `ip-100-64-171-120` of `ip-100-64-171-120.ec2.internal`); else cut, and the
    cut said with `~`."""
    if len(name) <= width:
        return name
    host = name.split(".", 1)[0]
    if host and len(host) <= width:
        return host
    return name[:width - 1] + "~"


def name_width(names: list[str]) -> int:
    return max(NAME_MIN, min(NAME_MAX, max((len(n) for n in names), default=0)))


# The sample fields a node's row reads: a source that asks only for what is drawn
# (tuimon prom, ClusterState.set_drawn) asks no more for a readout.
ROW_READS = frozenset({*(key for key, _ in BUSY_FIELDS), "temp", "power", "clock_events",
                       "failed", "cpu_util", "tx_util", "state", "phys_state", "errors_inc",
                       "xid_total", "last_xid"})


def node_row(node: NodeState, now: float, width: int = NAME_MIN) -> str:
    gpus = node.gpu_values()
    utils = [b for b in (gpu_busy(g)[0] for g in gpus) if b is not None]
    temps = [t for g in gpus if (t := g.get("temp")) is not None]
    power = [w for g in gpus if (w := g.get("power")) is not None]
    throttled = sum(1 for g in gpus if set(g.get("clock_events") or ()) - {"gpu_idle"})
    failed = sum(1 for g in gpus if g.get("failed"))
    # The XIDs its GPUs say they have seen, counted as the XID finding counts them (the
    # only count Prometheus gives: it sends no XID event), or the XID events this viewer
    # received, where more.
    xids = max(node.xids, sum(xids_seen(g.get("xid_total"), g.get("last_xid")) for g in gpus))
    host = host_row(node.detail)
    mean = _mean(utils)
    status = node.status
    if status != UP:
        age = node.age(now)
        status += f" {age:.0f}s" if age is not None else ""
    cpu = host.get("cpu_util")
    ports = port_rows(node.detail)
    ib = [u for p in ports if (u := p.get("tx_util")) is not None]
    ib_mean = _mean(ib)
    ib_bad = sum(1 for p in ports
                 if port_down(p.get("state"), p.get("phys_state")) or p.get("errors_inc"))
    row = (f"{shown_name(node.name, width):<{width}} {status:<10} {node.gpu_count:>4} "
           f"{(f'{mean * 100:.0f}%' if mean is not None else '-'):>5} "
           f"{(f'{max(temps):.0f}C' if temps else '-'):>5} "
           f"{(f'{sum(power) / 1000:.1f}kW' if power else '-'):>7} "
           f"{throttled:>4} {failed:>4} {xids:>4} "
           f"{(f'{cpu * 100:.0f}%' if cpu is not None else '-'):>5} "
           f"{(f'{ib_mean * 100:.0f}%' if ib_mean is not None else '-'):>5} {ib_bad:>5}")
    if node.reason and node.status != UP:
        row += f"  {node.reason}"
    return row


def render(cluster: ClusterState, max_rows: int = 40,
           judge: Judgement | None = None, findings: list[Finding] | None = None) -> str:
    """The node table, the shared file systems, the latest events and, with a judgement
    (run by the caller), what `tuimon status` says: jobs, SLI, budget, burn, diagnosis."""
    now = cluster.clock()
    counts = cluster.counts()
    interval = cluster.interval()
    lines = [
        f"tuimon  {cluster.name}  nodes up {counts[UP]} / stale {counts[STALE]} / down "
        f"{counts[DOWN]}" + (f" / unknown {counts[UNKNOWN]}" if counts[UNKNOWN] else "")
        + f"  GPUs {cluster.gpu_total()}  interval "
        f"{f'{interval:g}s' if interval else '-'}  {time.strftime('%H:%M:%S')}",
    ]
    nodes = sorted(cluster.nodes.values(), key=lambda n: n.name)
    width = name_width([n.name for n in nodes[:max_rows]])
    lines += ["", f"{'node':<{width}} {'status':<10} {'GPUs':>4} {'util':>5} {'temp':>5} "
                  f"{'power':>7} {'thr':>4} {'fail':>4} {'xid':>4} {'cpu':>5} {'IB tx':>5} "
                  f"{'IBbad':>5}"]
    lines += [node_row(n, now, width) for n in nodes[:max_rows]]
    if len(nodes) > max_rows:
        lines.append(f"... and {len(nodes) - max_rows} more nodes")
    storage = judge.storage.filesystems if judge is not None else {}
    if storage:
        lines.append("")
        wide = max(24, min(NAME_MAX, max(len(m) for m in storage)))
        lines.append(f"{'file system':<{wide}} {'type':<7} {'read':>10} {'write':>10} "
                     f"{'nodes':>5}")
        for mount, fs in sorted(storage.items()):
            shown = mount if len(mount) <= wide else mount[:wide - 1] + "~"
            lines.append(f"{shown:<{wide}} {fs.fstype[:7]:<7} {fs.read / 1e9:>8.1f}GB/s "
                         f"{fs.write / 1e9:>8.1f}GB/s {fs.nodes:>5}")
    if cluster.events:
        lines.append("")
        lines.append("recent events:")
        for ev in list(cluster.events)[:5]:
            lines.append(f"  {time.strftime('%H:%M:%S', time.localtime(ev.ts))} "
                         f"{ev.severity:<8} {ev.message}")
    if judge is not None:
        # (`findings`: a snapshot's, with the nodes it never reached; else the judgement's)
        judged = judge.diagnosis.findings if findings is None else findings
        lines.append("")
        lines.append(format_text(report(cluster, judge.efficiency, judged,
                                        verdict(cluster, judged))))
    # Names, reasons and messages came from the network: nothing raw reaches the terminal.
    return clean_lines("\n".join(lines))
