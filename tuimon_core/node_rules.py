"""The node-local rules: what one node's own frames say is wrong with it.

GPUs failed, throttling, XIDs, ECC, row remapping, links down, disabled or flapping,
port error counters, RoCE pauses, pause storms and drops, NFS latency, step reports
refused or lost (the fabric's, with their thresholds and why: docs/definitions.md).
Each needs only this node's data, so the same rules can run wherever the data is (the
viewer, the relay, the agent). Counters are judged over a window, not on the latest
sample: the agent reads IB error counters one sample in five, so "symbol errors in the
last 10 minutes" is a steady condition where "an increment in this sample" would
flicker. `FindingBook` adds the hold and the hysteresis on top.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from tuimon_core import xids
from tuimon_core.findings import Finding
from tuimon_core.gpu_state import Throttle, throttle, xids_seen
from tuimon_core.link_rules import LinkRules
from tuimon_core.protocol.fields import (
    PORT_DISABLED,
    PORT_ERROR_COUNTERS,
    port_down,
    port_up,
)
from tuimon_core.protocol.row_access import filesystem_rows, gpu_rows, port_rows
from tuimon_core.protocol.rows import PortRow
from tuimon_core.wording import plural
from tuimon_core.write_surge import WriteSurge

# Congestion: sustained above this (xmit_wait ticks/s), senders starve; a port or a leaf
# this many times its peers' median stands out (here: the node's other ports; in the
# viewer's cluster rules: all ports, or the other leaves).
CONGESTED_WAIT = 1e4
OUTLIER_FACTOR = 10.0
# A RoCE port that holds its peer off this share of the time or more is pausing the
# fabric: its pauses back up the switch port, then the ports that feed it.
PAUSING_SHARE = 0.2
# Packets a port drops for lack of receive buffer, averaged over DROP_WINDOW_S: a finding
# only at DROP_RATE a second AND DROP_SHARE of what arrived, both. On a PFC priority a
# drop is a lossless packet lost, and ConnectX recovers it by go-back-N: the sender
# resends everything from the lost packet on, about a bandwidth-delay product (400 Gb/s
# x ~10 us, ~500 KB, ~125 packets of 4 KiB). A share p of drops then costs about 125 x p
# of the port's traffic: 1e-4 is ~1 % of goodput, where a collective starts to take
# measurably longer. Under 100 drops a second the resends stay under ~50 MB/s, 0.1 % of a
# 400 Gb/s port, whatever the share (an idle port's one burst). The window (not one
# sample) keeps a burst of a second from raising it, and bursty drops from flickering.
DROP_RATE = 100.0
DROP_SHARE = 1e-4
DROP_WINDOW_S = 30.0
ERRORS_WINDOW_S = 600.0  # port error counters and link flaps
XID_WINDOW_S = 1800.0
STEPS_WINDOW_S = 600.0
# Step refusals at the node's caps (agent.steps): a real job's reports may be among them.
STEP_CAPS = ("too_many_jobs", "too_many_ranks")
SLOW_NFS_S = 0.05  # a READ slower than this on average, held: a finding
FLAPS = 2  # link downs in the window that make a port flapping
ERROR_COUNTERS = frozenset(PORT_ERROR_COUNTERS)
PORT_ERRORS = ("rcv_errors", "link_error_recovery", "remote_physical_errors",
               "xmit_discards", "buffer_overruns", "local_link_integrity_errors")


def _share(n: float, of: float) -> str:
    """A share as people read it: 61%, 2.5%, 0.012%."""
    pct = 100 * n / of
    return f"{pct:.0f}%" if pct >= 10 else f"{pct:.2g}%"


def _pause_words(p: PortRow) -> str:
    """Which pause held the peer, as the port's counters say: PFC only where its
    per-priority pause counters moved, global pause where the 802.3x ones did."""
    by = p.get("pause_by")
    if by == "pfc":
        prios = ",".join(str(x) for x in p.get("pfc") or [])
        return f" (PFC, priority {prios})" if prios else " (PFC)"
    if by == "global":
        return " (global pause)"
    if by == "pfc+global":
        return " (PFC and global pause)"
    return ""  # an agent that does not say (before the pause kinds were sent)


def _window(q: deque[tuple[float, int]], now: float, span: float) -> int:
    while q and q[0][0] < now - span:
        q.popleft()
    return sum(n for _, n in q)


@dataclass
class NodeRules:
    """One node's windows, fed with each new sample."""

    name: str
    _errors: dict[tuple[str, str], deque[tuple[float, int]]] = field(default_factory=dict)
    # Ports that ever counted an error: the others need no window arithmetic (a viewer of
    # 1024 nodes judges ~33k ports a second, nearly all of them clean).
    _error_ports: set[str] = field(default_factory=set)
    _xid: dict[int, tuple[int | None, int | None, float]] = field(default_factory=dict)
    _steps: dict[str, deque[tuple[float, int]]] = field(default_factory=dict)
    _steps_last: dict[str, int] = field(default_factory=dict)
    _steps_reasons: dict[str, int] = field(default_factory=dict)
    # RoCE ports that dropped packets: per sample (t, dropped, arrived, lossless
    # dropped, lossless arrived), counts over the sample's interval, DROP_WINDOW_S kept.
    # Only ports that have dropped are kept: most never do.
    _drops: dict[str, deque[tuple[float, float, float, float, float]]] = field(
        default_factory=dict)
    # Ports seen ACTIVE and LinkUp since these rules started: one disabled later was
    # disabled while watched (a warning); one never seen up was configured so.
    _seen_up: set[str] = field(default_factory=set)
    _last_t: float | None = None
    _sample: Any = None
    _hello: Any = None
    _seq: int | None = None
    _links: LinkRules | None = None
    _surge: WriteSurge | None = None

    def observe(self, hello: Any, sample: Any, now: float) -> None:
        """A sample arrived (the same one again is ignored)."""
        self._hello = hello
        if sample is None or (sample.seq == self._seq and sample is self._sample):
            return
        self._seq = sample.seq
        self._sample = sample
        if self._links is None or self._links.name != self.name:
            self._links = LinkRules(self.name)
        self._links.observe(sample, now)
        # The time the sample's rates cover: since the last sample, as far as the window.
        dt = now - self._last_t if self._last_t is not None else sample.interval
        dt = min(max(dt if isinstance(dt, (int, float)) else 0.0, 0.0), DROP_WINDOW_S)
        self._last_t = now
        if self._surge is None or self._surge.node != self.name:
            self._surge = WriteSurge(self.name)
        self._surge.observe(filesystem_rows(sample), now, dt)
        seen_up, drops = self._seen_up, self._drops
        for p in port_rows(sample):
            if port_up(p.get("state"), p.get("phys_state")):
                seen_up.add(p["id"])
            if p["id"] in drops or p.get("discards_s"):
                self._note_drops(p, now, dt)
            inc, storms = p.get("errors_inc"), p.get("pause_storms")
            if not (inc or storms):
                continue  # the usual port: nothing counted this sample
            counted = dict(inc or {})
            if storms:
                counted["pause_storms"] = storms
            for kind, n in counted.items():
                if isinstance(n, (int, float)) and n > 0:
                    self._errors.setdefault((p["id"], kind), deque()).append((now, int(n)))
                    self._error_ports.add(p["id"])
        for i, g in enumerate(gpu_rows(sample)):
            total, code = g.get("xid_total"), g.get("last_xid")
            before = self._xid.get(i)
            if code is None and not total:
                continue
            if before is None or (total or 0) > (before[0] or 0) or code != before[1]:
                self._xid[i] = (total, code, now)  # first seen, or a new one: now
        steps = sample.extra.get("steps") or {}
        refused = steps.get("refused")
        if isinstance(refused, dict):
            self._steps_reasons = {k: v for k, v in refused.items() if isinstance(v, int)}
        capped = sum(self._steps_reasons.get(k, 0) for k in STEP_CAPS)
        for key, value in (("lost", steps.get("lost")), ("rejected", steps.get("rejected")),
                           ("capped", capped)):
            if isinstance(value, int):
                last = self._steps_last.get(key)
                if last is not None and value > last:
                    self._steps.setdefault(key, deque()).append((now, value - last))
                self._steps_last[key] = value

    def conditions(self, now: float) -> list[Finding]:
        sample = self._sample
        if sample is None:
            return []
        out: list[Finding] = []
        out += self._gpus(sample, now)
        out += self._ports(sample, now)
        out += self._storage(sample)
        out += self._step_reports(now)
        if self._links is not None:
            out += self._links.conditions(self._hello, sample, now)
        if self._surge is not None:
            out += self._surge.conditions(now)
        return out

    # -- rules ------------------------------------------------------------------------

    def _gpus(self, sample: Any, now: float) -> list[Finding]:
        node = self.name
        out = []
        capped: list[tuple[int, Throttle]] = []
        infos = list(self._hello.gpus) if self._hello is not None else []
        slowed: dict[tuple[str, ...], list[tuple[int, Throttle]]] = {}
        for i, g in enumerate(gpu_rows(sample)):
            get = g.get
            # Nearly every GPU of nearly every node is fine: what they are is read first,
            # and the words for a finding are made only where one is.
            if not (get("failed") or get("clock_events") or i in self._xid
                    or get("ecc_uncorrected") or get("remap_failed")
                    or get("remap_pending")):
                continue
            where = f"{node} GPU {i}"
            if get("failed"):
                out.append(Finding("critical", "gpu_failed", f"{where} failed: {g['failed']}",
                                   node=node, gpu=i, score=0.6))
                continue
            found = throttle(g, infos[i] if i < len(infos) else None) \
                if get("clock_events") else None
            if found is None:
                pass
            elif found.kind == "thermal":
                temp: float | None = g.get("temp")
                at = f" at {temp:.0f} °C" if temp is not None else ""
                clocks = f" ({found.clocks()})" if found.clocks() else ""
                out.append(Finding("warning", "thermal",
                                   f"{where} thermal throttling{at}{clocks}",
                                   node=node, gpu=i, score=0.4))
            elif found.kind == "hw_slowdown":
                slowed.setdefault((found.severity, *found.reasons), []).append((i, found))
            else:
                capped.append((i, found))
            total, code, seen = self._xid.get(i, (None, None, 0.0))
            if code and now - seen <= XID_WINDOW_S:
                out.append(Finding(xids.severity(code), "xid",
                                   f"{where} XID {code} ({xids_seen(total, code)} seen)",
                                   node=node, gpu=i, score=0.3))
            if (g.get("ecc_uncorrected") or 0) > 0:
                out.append(Finding("critical", "ecc", f"{where} {g['ecc_uncorrected']} "
                                   "uncorrected ECC errors", node=node, gpu=i, score=0.3))
            if g.get("remap_failed"):
                out.append(Finding("critical", "remap", f"{where} row remapping failed: "
                                   "drain and reset", node=node, gpu=i, score=0.3))
            elif g.get("remap_pending"):
                out.append(Finding("warning", "remap_pending", f"{where} a row remap awaits "
                                   "a GPU reset", node=node, gpu=i, score=0.1))
        if capped:  # one finding per node: a power cap is usually the node's, not a GPU's
            gpus = ",".join(str(i) for i, _ in capped)
            out.append(Finding("info", "power", f"{node} GPU {gpus} power-capped "
                               f"({', '.join(capped[0][1].reasons)})", node=node, score=0.2))
        # A hardware slowdown that collapsed the clocks: a fault of the node's power or
        # cooling more often than of one GPU, so one finding for the GPUs it holds alike.
        for (severity, *reasons), held in slowed.items():
            gpus = ",".join(str(i) for i, _ in held)
            first = held[0][1]
            busy = "while busy" if severity == "critical" else "while idle"
            out.append(Finding(severity, "hw_slowdown",
                               f"{node} GPU {gpus} hardware slowdown {busy}: "
                               f"{first.clocks()} ({', '.join(reasons)})",
                               node=node, gpu=held[0][0] if len(held) == 1 else None,
                               score=0.6))
        return out

    def _ports(self, sample: Any, now: float) -> list[Finding]:
        node = self.name
        ports = port_rows(sample)
        out = self._congestion(ports)
        drops = self._drops
        for p in ports:
            pid = p["id"]
            counted = pid in self._error_ports
            # The usual port: up, no error counted ever, no pause, no drop, no counter
            # stuck; read first, the words for a finding made only where one is.
            if not (counted or pid in drops or p.get("saturated")
                    or port_down(p.get("state"), p.get("phys_state"))):
                paused = p.get("paused_tx")
                if not (isinstance(paused, (int, float)) and paused >= PAUSING_SHARE):
                    continue
            where = f"{node} {pid}"
            downs = self._count(pid, "link_downed", now) if counted else 0
            if port_down(p.get("state"), p.get("phys_state")):
                out.append(self._not_up(p, where))  # it carries nothing
            elif downs >= FLAPS:
                out.append(Finding("warning", "flapping", f"{where} link went down {downs} "
                                   "times in 10 min", node=node, port=pid, score=0.6))
            symbols = self._count(pid, "symbol_errors", now) if counted else 0
            if symbols:
                out.append(Finding("warning", "symbol_errors", f"{where} +{symbols} symbol "
                                   "errors in 10 min (cable or transceiver)",
                                   node=node, port=pid, score=0.4))
            saturated = p.get("saturated")
            stuck = sorted(set(saturated) & ERROR_COUNTERS) if saturated else []
            if stuck:
                # A narrow error counter at its maximum counts no more: the errors that
                # filled it may still be coming, and nothing shows them.
                out.append(Finding("warning", "counter_saturated",
                                   f"{where} {', '.join(stuck)} counter stuck at its maximum: "
                                   "errors reached it and new ones no longer show (clear the "
                                   "port's counters: perfquery -R)", node=node, port=pid,
                                   score=0.3))
            out += self._lossless(p, where, now, counted)
            if not counted:
                continue
            others = {k: self._count(pid, k, now) for k in PORT_ERRORS}
            others = {k: n for k, n in others.items() if n}
            if others:
                text = ", ".join(f"+{n} {k}" for k, n in sorted(others.items()))
                out.append(Finding("warning", "port_errors", f"{where} {text} in 10 min",
                                   node=node, port=pid, score=0.3))
        return out

    def _not_up(self, p: PortRow, where: str) -> Finding:
        """A port that carries nothing: a link fault, or a port someone turned off.

        `Disabled` is what management set: an InfiniBand port disabled by the subnet
        manager or `ibportstate`, a RoCE port whose netdev was set down. A port in that
        state since these rules first saw it is how the node is configured (a second port
        the site never cabled): information. One they saw up and then disabled was turned
        off under its traffic, by someone or something: a warning. A RoCE port reads
        Disabled without carrier too (mlx5 reports ACTIVE/LinkUp only for a running netdev
        with carrier, Disabled otherwise), so one whose netdev is up (`admin_up` 1) is a
        link fault after all. Any other state (Polling: no peer or no signal;
        LinkErrorRecovery; Down while LinkUp) is a link fault: critical."""
        pid = p["id"]
        phys = p.get("phys_state")
        state = p.get("state_name") or "down"
        if phys == PORT_DISABLED and p.get("admin_up") != 1:
            how = "set down (its netdev is down)" if p.get("admin_up") == 0 else "disabled"
            if pid in self._seen_up:
                return Finding("warning", "port_disabled",
                               f"{where} {how} while in use (it was ACTIVE, LinkUp): someone "
                               "or something turned it off", node=self.name, port=pid,
                               score=0.5)
            return Finding("info", "port_disabled",
                           f"{where} {how} since first seen: configured off, not a link "
                           "fault", node=self.name, port=pid)
        if phys == PORT_DISABLED:
            why = " (Disabled, no carrier while its netdev is up: cable, transceiver or " \
                "the switch port)"
        else:  # the physical state where it is itself down (port_down of it alone)
            why = f" ({p.get('phys_state_name') or phys})" if port_down(None, phys) else ""
        return Finding("critical", "link_down", f"{where} link {state}{why}",
                       node=self.name, port=pid, score=0.8)

    def _note_drops(self, p: PortRow, now: float, dt: float) -> None:
        """Keep a RoCE port's drops and arrivals of this sample, as counts over its
        interval, in the port's window (started by its first drop)."""
        pid = p["id"]
        q = self._drops.get(pid)
        dropped = p.get("discards_s")
        if q is None and not (isinstance(dropped, (int, float)) and dropped > 0):
            return
        if q is None:
            q = self._drops[pid] = deque()
        rates: tuple[float | None, ...] = (dropped, p.get("arrived_s"),
                                           p.get("lossless_discards_s"),
                                           p.get("lossless_arrived_s"))
        d, a, ld, la = (n * dt if isinstance(n, (int, float)) else 0.0 for n in rates)
        q.append((now, d, a, ld, la))
        while q and q[0][0] <= now - DROP_WINDOW_S:
            q.popleft()
        if not any(e[1] for e in q):  # no drop left in the window: back to the cheap path
            del self._drops[pid]

    def _dropping(self, p: PortRow, where: str, now: float) -> Finding | None:
        """A RoCE port dropping what arrives for lack of buffer, over DROP_WINDOW_S: at
        DROP_RATE a second and DROP_SHARE of the traffic both. On its PFC priorities that
        is lossless traffic lost: a warning. Elsewhere (no PFC on the port, or drops on
        its other priorities: a plain Ethernet port under a flood, TCP) the senders'
        transports recover as they always do: information at most."""
        q = self._drops.get(p["id"])
        while q and q[0][0] <= now - DROP_WINDOW_S:  # a node whose samples stopped
            q.popleft()
        if not q:
            return None
        sums = [sum(e[i] for e in q) for i in range(1, 5)]
        dropped, arrived, lossless, lossless_arrived = sums
        pfc = p.get("pfc") or []

        def holds(n: float, of: float) -> bool:
            return n / DROP_WINDOW_S >= DROP_RATE and of > 0 and n / of >= DROP_SHARE

        if holds(lossless, lossless_arrived):
            prios = ",".join(str(x) for x in pfc)
            return Finding("warning", "port_drops",
                           f"{where} drops {lossless / DROP_WINDOW_S:,.0f} lossless packets "
                           f"a second (PFC priority {prios}; {_share(lossless, lossless_arrived)} "
                           "of what arrives there): the senders resend, the job waits",
                           node=self.name, port=p["id"], score=0.8)
        if holds(dropped, arrived):
            where_not = "on priorities without PFC" if pfc else "no PFC on this port"
            return Finding("info", "port_drops",
                           f"{where} drops {dropped / DROP_WINDOW_S:,.0f} packets a second "
                           f"({_share(dropped, arrived)} of what arrives; {where_not}: "
                           "lossy traffic, its senders recover)", node=self.name,
                           port=p["id"])
        return None

    def _lossless(self, p: PortRow, where: str, now: float,
                  counted: bool) -> list[Finding]:
        """A RoCE port's PFC: a storm (the NIC's watchdog stopped sending pauses), a port
        that holds its peer off much of the time (it cannot take what arrives, and its
        pauses spread back through the fabric), lossless traffic dropped."""
        out = []
        pid = p["id"]
        storms = self._count(pid, "pause_storms", now) if counted else 0
        if storms:
            out.append(Finding("warning", "pfc_storm",
                               f"{where} PFC storm: the pause watchdog fired "
                               f"{plural(storms, 'time')} in 10 min (pauses stopped to break "
                               "it; lossless traffic may have been dropped)",
                               node=self.name, port=pid, score=0.7))
        paused: float | None = p.get("paused_tx")
        if isinstance(paused, (int, float)) and paused >= PAUSING_SHARE:
            out.append(Finding("warning", "pfc_pausing",
                               f"{where} holds its peer off {paused * 100:.0f}% of the time"
                               f"{_pause_words(p)}", node=self.name, port=pid, score=0.8))
        dropping = self._dropping(p, where, now)
        if dropping is not None:
            out.append(dropping)
        return out

    def _congestion(self, ports: list[PortRow]) -> list[Finding]:
        """A port far above the node's other ports: what a node can judge of congestion
        alone (a cable, a port's peer on the switch, a job's traffic pinned to one rail).
        A whole node or leaf waiting is the viewer's cluster rule: it compares nodes."""
        # The waits alone first: on most nodes no port waits enough to look further.
        ordered = [w for p in ports if isinstance(w := p.get("xmit_wait_s"), (int, float))]
        if len(ordered) < 3 or max(ordered) < CONGESTED_WAIT:
            return []
        ordered.sort()
        # No port can stand out where the highest is not OUTLIER_FACTOR times a bound
        # below every port's median of the others (one port less moves no other down
        # by more than one place): the usual busy fabric, every port alike. (Waits are
        # finite: the sample's check refuses NaN, with which no order would hold.)
        floor = ordered[max(0, (len(ordered) - 1) // 2 - 1)]
        if ordered[-1] < OUTLIER_FACTOR * max(floor, 1.0):
            return []
        out = []
        waits = [(p["id"], w) for p in ports
                 if isinstance(w := p.get("xmit_wait_s"), (int, float))]
        for pid, wait in waits:
            if wait < CONGESTED_WAIT:
                continue
            others = ordered.copy()
            others.remove(wait)  # the port's own (any one of equal waits: the same list)
            mid = len(others) // 2
            median = others[mid] if len(others) % 2 else (others[mid - 1] + others[mid]) / 2
            if wait >= OUTLIER_FACTOR * max(median, 1.0):
                out.append(Finding("warning", "congestion",
                                   f"{self.name} {pid}: congestion: xmit_wait {wait:,.0f}/s vs "
                                   f"{median:,.0f}/s median of the node's other "
                                   f"{len(others)} ports", node=self.name, port=pid,
                                   score=0.9))
        return out

    def _count(self, pid: str, kind: str, now: float) -> int:
        q = self._errors.get((pid, kind))
        return _window(q, now, ERRORS_WINDOW_S) if q else 0

    def _storage(self, sample: Any) -> list[Finding]:
        out = []
        for f in filesystem_rows(sample):
            lat = (f.get("latency") or {}).get("READ")
            if isinstance(lat, (int, float)) and lat > SLOW_NFS_S:
                out.append(Finding("warning", "storage_latency",
                                   f"{self.name} {f['id']}: NFS reads take {lat * 1000:.0f} ms",
                                   node=self.name, fs=f["id"], score=0.5))
        return out

    def _step_reports(self, now: float) -> list[Finding]:
        out = []
        refused = _window(self._steps.get("rejected", deque()), now, STEPS_WINDOW_S)
        if refused:
            reasons = ", ".join(f"{k} {v}" for k, v in sorted(self._steps_reasons.items()))
            # Refused for what the sender sent (malformed, another user's job, a flood)
            # costs the sender alone: information. Refused at the node's caps, a real
            # job's ranks may be among them: a warning.
            capped = _window(self._steps.get("capped", deque()), now, STEPS_WINDOW_S)
            out.append(Finding("warning" if capped else "info", "steps_refused",
                               f"{self.name} refused {refused} step reports in 10 min"
                               + (f" (since start: {reasons})" if reasons else ""),
                               node=self.name))
        lost = _window(self._steps.get("lost", deque()), now, STEPS_WINDOW_S)
        if lost:
            out.append(Finding("warning", "steps_lost", f"{self.name}: {lost} step reports "
                               "lost before the agent read them in 10 min (a flood on the "
                               "step socket?)", node=self.name))
        return out
