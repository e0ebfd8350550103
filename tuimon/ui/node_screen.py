"""The node screen: everything about one node, with 5-minute sparklines."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from tuimon.model.cluster import ClusterState
from tuimon.model.diagnosis import Finding
from tuimon.model.guard import Guard
from tuimon.model.map_kinds import gpu_busy, gpu_health
from tuimon.model.node_state import NodeState
from tuimon.model.view_state import ViewWants
from tuimon.text.markup import safe
from tuimon.text.severity import severity_style
from tuimon.text.sparkline import sparkline
from tuimon_core.node_states import DOWN, STALE, UNKNOWN, UP
from tuimon_core.protocol.fields import port_down
from tuimon_core.protocol.row_access import (
    disk_rows,
    filesystem_rows,
    host_row,
    port_info_rows,
    port_rows,
)
from tuimon_core.protocol.rows import GpuRow, PortInfoRow, ProcessRow
from tuimon_core.protocol.text import clean
from tuimon_core.units import rate, size
from tuimon_core.wording import held_text


def _f(v: float | None, fmt: str = "{:.0f}", scale: float = 1.0) -> str:
    return "-" if v is None else fmt.format(v / scale)


def _process(p: ProcessRow, width: int) -> str:
    """One process on a GPU: pid, user, GPU memory, its job or pod, then the command."""
    owner = "-"
    if p.get("job"):
        owner = f"slurm job {p['job']}"
    elif p.get("pod"):
        owner = f"pod {p.get('namespace')}/{p['pod']}"
    elif p.get("pod_uid"):
        owner = f"pod {str(p['pod_uid'])[:8]}"
    elif p.get("container"):
        owner = f"{p.get('runtime') or 'container'} {p['container']}"
    head = (f"[$accent]{_f(p.get('pid')):>7}[/] {safe(str(p.get('user') or '-'), 10):<10} "
            f"{_f(p.get('mem'), '{:>5.1f}G', 2**30)}  {safe(owner, 40):<24}")
    room = max(10, width - 50)
    return f"{head} {safe(str(p.get('command') or '-'), room)}"


def _links(g: GpuRow, info: Any) -> str:
    """`Gen5 x16/5x16  18/18`: the GPU's PCIe link now and at most (an idle GPU may run
    lower), its NVLinks up of all; a link below its most while busy is marked."""
    gen, width = g.get("pcie_gen"), g.get("pcie_width")
    gmax, wmax = info.pcie_gen_max, info.pcie_width_max
    now = (f"Gen{gen or '?'} x{width or '?'}/{gmax or '?'}x{wmax or '?'}"
           if gen or width or gmax or wmax else "-")  # a source that reports no link
    low = (gen and gmax and gen < gmax) or (width and wmax and width < wmax)
    pcie = f"[$warning]{now:<13}[/]" if low else f"{now:<13}"
    nvl = f"{info.nvlinks}/{info.nvlinks_total}" if info.nvlinks_total else "-"
    return f"{pcie} {nvl:>7}"


class NodeScreen(Screen[None]):
    BINDINGS = [Binding("escape", "app.pop_screen", "back", id="back"),
                Binding("q", "app.pop_screen", "back", show=False, id="back_q")]
    DEFAULT_CSS = """
    NodeScreen Static { padding: 0 1; text-wrap: nowrap; text-overflow: ellipsis; }
    #node-title { background: $panel; height: 1; padding: 0 1; }
    #node-why { border: round $error; padding: 0 1; }
    """

    def __init__(self, cluster: ClusterState, node: NodeState,
                 findings: Callable[[], list[Finding]] = list,
                 now: Callable[[], float] = time.time) -> None:
        super().__init__()
        self.cluster = cluster
        # What the screen tells the model (the one thing a view does): the node it shows.
        self.wants: ViewWants = cluster
        self.node = node
        # What the diagnosis holds now: a port's errors over its window, not only the
        # latest sample's increments (read one sample in five).
        self.findings = findings
        self.now = now  # the judgement's clock: how long each finding has held
        self.guard = Guard()

    def compose(self) -> ComposeResult:
        yield Static(id="node-title")
        with VerticalScroll():
            yield Static(id="node-why")
            yield Static(id="node-findings")
            yield Static(id="node-gpus")
            yield Static(id="node-fabric")
            yield Static(id="node-storage")
            yield Static(id="node-events")
            yield Static(id="node-agent")
        yield Footer()

    def on_mount(self) -> None:
        # Every value of this node from now on, not just its overview: the sources switch
        # its subscription (directly, or through the relay that carries it).
        self.wants.set_detail({self.node.target})
        self.refresh_view()
        self.set_interval(1.0, self.refresh_view)

    def on_unmount(self) -> None:
        self.wants.set_detail(set())

    def refresh_view(self) -> None:
        n = self.node
        status = {UP: "$success", STALE: "$warning", DOWN: "$error",
                  UNKNOWN: "$warning"}.get(
            n.status, "$foreground")
        age = n.age()
        title = f"[b]{safe(n.name, 40)}[/b]  [{status}]{n.status}[/]"
        if n.target != n.name:  # where it is reached, when that is not its name
            title += f"  {safe(n.target, 40)}"
        self.query_one("#node-title", Static).update(title)
        why = self.query_one("#node-why", Static)
        if n.status == UP:
            why.display = False
        else:
            # Why it is not up, first and in full: what an on-call engineer came for.
            seen = (f"last frame {age:.0f} s ago" if age is not None else
                    "never reached")
            shown = "the values below are the last ones received" if n.detail else \
                "no values received"
            why.update(f"[{status}][b]{n.status}[/b][/]: {safe(n.reason or 'no frames', 200)}"
                       f"\n{seen}; {shown}; tuimon keeps reconnecting")
            why.display = True
        # Each section alone: one that cannot be drawn (a bug) says so in its place.
        for part, section in (("findings", self._found), ("gpus", self._gpus),
                              ("fabric", self._fabric), ("storage", self._storage),
                              ("events", self._events), ("agent", self._agent)):
            name = f"the node screen's {part}"
            text = self.guard.run(name, section, None)
            if text is None:
                text = (f"[$error]{part}: internal error: "
                        f"{safe(self.guard.errors.get(name, ''), 160)}[/] (a bug; the log "
                        "has the traceback)")
            self.query_one(f"#node-{part}", Static).update(text)

    def _found(self) -> str:
        """What the diagnosis holds about this node, worst first: what a slow node shows
        (a downtrained link, NVLinks down, throttling) before its numbers."""
        n = self.node
        mine = [f for f in self.findings() if f.node == n.name or n.name in f.nodes]
        now = self.now()
        if not mine:
            return "[b]found here[/b]  nothing"
        return "\n".join(["[b]found here[/b]"] + [
            f" [{severity_style(f.severity)}]{f.severity:<8}[/] "
            f"{safe(held_text(clean(f.message)[:200], f.first_seen, now), 240)}"
            for f in mine[:12]])

    def _gpus(self) -> str:
        n = self.node
        if n.hello is None:
            return "[b]GPUs[/b]  waiting for the agent's hello"
        if not n.hello.gpus:
            return f"[b]GPUs[/b]  none: {safe(n.hello.gpu_status or 'no GPUs', 120)}"
        width = self.size.width or 120
        spark = 12 if width < 110 else 30  # the sparkline gives way on narrow terminals
        wide = width >= 150
        lines = [f"[b]GPUs[/b]  {'busy (5 min)':<{spark + 4}}  temp power        mem       "
                 + ("SM clock  P  ECC c/u  XID procs  PCIe now/max  NVLinks  clock events"
                    if wide else "procs")]
        values = n.gpu_values()
        if n.detail is None and n.sample is not None:
            lines.append(" [$secondary]asking the node for every value (the map shows its "
                         "overview): the next sample brings them[/]")
        sources: set[str] = set()
        for i in range(len(n.hello.gpus)):
            g: GpuRow = values[i] if i < len(values) else {}
            hist = n.busy_history(i)
            failed = g.get("failed")
            if failed:
                lines.append(f" {i:>2} [$error]FAILED: {safe(failed, 100)}[/]")
                continue
            health = gpu_health(g)
            mark = "[$error]!![/]" if health == 1.0 else "[$warning]! [/]" if health else "  "
            busy, source = gpu_busy(g)
            if source:
                sources.add(source)
            line = sparkline([float(x) for x in hist], spark, 100.0)
            row = (f"{mark}{i:>1} [$heat-4]{line:<{spark}}[/] "
                   f"{_f(busy, '{:>4.0f}%', 0.01)}  {_f(g.get('temp'), '{:>3.0f}C')} "
                   f"{_f(g.get('power'), '{:>4.0f}')}/{_f(g.get('power_limit'), '{:.0f}W')} "
                   f"{_f(g.get('mem_used'), '{:>4.0f}', 2**30)}/"
                   f"{_f(g.get('mem_total'), '{:.0f}G', 2**30)}")
            if wide:
                events = ", ".join(e.replace("_", " ") for e in (g.get("clock_events") or []))
                row += (f"  {_f(g.get('sm_clock'), '{:>5.0f}', 1e6)}MHz  {_f(g.get('pstate'))}  "
                        f"{_f(g.get('ecc_corrected'))}/{_f(g.get('ecc_uncorrected'))}  "
                        f"{g.get('xid_total') or 0:>3} {_f(g.get('procs')):>5}  "
                        f"{_links(g, n.hello.gpus[i])}  {safe(events or '-', 60)}")
            else:
                row += f"  {_f(g.get('procs')):>5}"
            lines.append(row)
            for m in g.get("mig") or ():
                active = " ".join(f"{label} {x * 100:.0f}%" for x, label in (
                    (m.get("sm_active"), "SM"), (m.get("gr_active"), "engine"),
                    (m.get("tensor_active"), "tensor")) if isinstance(x, (int, float)))
                lines.append(
                    f"      MIG {m.get('gi')} {safe(str(m.get('profile') or '?'), 10):<10} "
                    f"mem {_f(m.get('mem_used'), '{:.1f}', 2**30)}/"
                    f"{_f(m.get('mem_total'), '{:.0f}G', 2**30)}  procs {_f(m.get('procs'))}"
                    + (f"  {active}" if active else ""))
                for p in m.get("processes") or ():
                    lines.append("        " + _process(p, width - 10))
            for p in g.get("processes") or ():
                lines.append("      " + _process(p, width - 8))
        lines.append(f"     {safe(n.hello.gpus[0].name or '', 40)}  driver "
                     f"{safe(n.hello.driver_version or '-', 20)}  busy: "
                     f"{', '.join(sorted(sources)) or '-'}")
        return "\n".join(lines)

    def _fabric(self) -> str:
        n = self.node
        if n.detail is None or n.hello is None:
            return ""
        info = {p["id"]: p for p in port_info_rows(n.hello)}
        ports = port_rows(n.detail)
        if not ports:
            return f"[b]fabric[/b]  no ports: {safe(n.hello.extra.get('fabric_status') or '-', 80)}"
        lines = ["[b]fabric[/b]  port        state     rate       tx          rx        "
                 "xmit_wait/s  errors (this read; held findings)"]
        held: dict[str, list[str]] = {}
        for f in self.findings():
            if f.node == n.name and f.port is not None:
                prefix = f"{n.name} {f.port}"
                text = f.message[len(prefix):].lstrip(" :") if f.message.startswith(
                    prefix) else f.message
                held.setdefault(f.port, []).append(text)
        for p in ports:
            i: PortInfoRow = info.get(p["id"]) or {}
            errs = ", ".join(f"{safe(k, 30)} +{v}" if v is not None else f"{safe(k, 30)} ?"
                             for k, v in (p.get("errors_inc") or {}).items())
            if p["id"] in held:
                errs = "; ".join([errs] * bool(errs) + [
                    f"[$warning]{safe(t, 120)}[/]" for t in held[p["id"]]])
            saturated = p.get("saturated")
            if saturated:
                errs += f" [$warning]saturated: {safe(', '.join(saturated), 80)}[/]"
            # No state: not asked (Prometheus asks only the ports not up).
            state_color = ("$error" if port_down(p.get("state"), p.get("phys_state")) else
                           "$foreground" if p.get("state") is None else "$success")
            lines.append(
                f"        {safe(p['id'], 12):<12} "
                f"[{state_color}]{safe(p.get('state_name') or '-', 8):<8}[/]"
                f"  {rate(i.get('rate')):>9}  {rate(p.get('tx_bytes_s')):>10}  "
                f"{rate(p.get('rx_bytes_s')):>10}  {_f(p.get('xmit_wait_s')):>10}  {errs or '-'}")
        return "\n".join(lines)

    def _storage(self) -> str:
        n = self.node
        if n.detail is None:
            return ""
        lines = ["[b]file systems[/b]  mount                 type    read        write       "
                 "used / size"]
        for fs in filesystem_rows(n.detail):
            total, free, error = fs.get("size"), fs.get("free"), fs.get("error")
            used = (f"{size(total - free)} / {size(total)}" if total and free is not None else
                    safe(fs.get("capacity_error") or "-", 40))
            lines.append(f"              {safe(fs['id'], 20):<20} "
                         f"{safe(fs.get('fstype') or '-', 8):<6} "
                         f"{rate(fs.get('read_bytes_s')):>10}  {rate(fs.get('write_bytes_s')):>10}"
                         f"  {used}" + (f"  [$error]{safe(error, 60)}[/]" if error else ""))
        for d in disk_rows(n.detail):
            lines.append(f"              {safe(d['id'], 20):<20} "
                         f"{safe(d.get('kind') or '-', 8):<6} "
                         f"{rate(d.get('read_bytes_s')):>10}  {rate(d.get('write_bytes_s')):>10}"
                         f"  busy {_f(d.get('busy'), '{:.0f}%', 0.01)}")
        if len(lines) == 1:
            return "[b]file systems[/b]  none reported"
        return "\n".join(lines)

    def _events(self) -> str:
        mine = [e for e in self.cluster.events if e.node == self.node.name][:8]
        if not mine:
            return "[b]events[/b]  none for this node"
        return "\n".join(["[b]events[/b]"] + [f"  {safe(e.kind, 20):<20} {safe(e.message, 120)}"
                                              for e in mine])

    def _agent(self) -> str:
        n = self.node
        if n.hello is None:
            return ""
        h = n.hello
        host = host_row(n.detail)
        return (f"[b]agent[/b]  version {safe(h.agent_version, 40)}  interval {h.interval:g}s  "
                f"boot id {safe(h.boot_id or '-', 40)}  families "
                f"{safe(', '.join(h.families), 100)}\n"
                f"[b]host[/b]   cpu {_f(host.get('cpu_util'), '{:.0f}%', 0.01)} of "
                f"{_f(host.get('cpus'))} CPUs  load {_f(host.get('load1'), '{:.1f}')}  mem "
                f"{_f(host.get('mem_used'), '{:.0f}', 2**30)}/"
                f"{_f(host.get('mem_total'), '{:.0f} GiB', 2**30)}"
                f"  up {_f(host.get('uptime'), '{:.1f} h', 3600)}"
                + (f"  [$warning]{n.dropped} frames dropped (slow link)[/]" if n.dropped else ""))
