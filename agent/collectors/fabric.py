"""Fabric collector: InfiniBand and RoCE ports from /sys/class/infiniband, NICs from
/sys/class/net.

Counters are hard: legacy PMA counters are narrow and *saturate* at their
width (they stop, they do not wrap), mlx5 `hw_counters` are 32-bit and *wrap*, drivers
reset counters, and a port with no PMA prints `N/A (no PMA)`. A saturated counter gives
no rate and flags the port; a counter that went down restarts its baseline; a counter
that cannot be read is nil with its reason. A rate is never negative and never a false 0.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from agent.collectors import pci
from agent.collectors.ethtool_stats import DROP_TOTALS, EthtoolStats, pause_summary
from agent.files import MISSING, FileTree, ReadError
from agent.rates import CounterSet, RateTracker, counter_rate
from tuimon_core.protocol.fields import (
    HW_COUNTERS,
    HW_ERROR_COUNTERS,
    NIC_COUNTERS_READ,
    PORT_COUNTERS_READ,
    PORT_ERROR_COUNTERS,
    link_util,
    port_up,
)
from tuimon_core.protocol.text import clean

IB = "sys/class/infiniband"
NET = "sys/class/net"
RATE_EVERY = 10  # samples between re-reads of link rate, firmware, board id
# The device directories are listed again this many samples apart, and at once when a
# port's or NIC's files stop answering (a device that went away): a new HCA or NIC is
# seen within that many seconds, and a second is not spent listing a dozen directories.
DISCOVER_EVERY = RATE_EVERY
# Error counters are read every ERRORS_EVERY samples (and at once when a link leaves
# ACTIVE): they move rarely, there are 8 a port, and their increments lose nothing by
# covering a few seconds. Data, packet and xmit_wait counters are read every sample.
ERRORS_EVERY = 5

# The port, NIC and hw counters read, their names and widths: the name table's.
RATE_COUNTERS = tuple(c.key for c in PORT_COUNTERS_READ if c.rate)
_ERROR_SET = frozenset(PORT_ERROR_COUNTERS)

_RATE_RE = re.compile(r"^\s*([0-9.]+)\s*Gb/sec")


def _text(raw: bytes | str) -> str:
    return raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw


class CounterError(ValueError):
    """A counter file whose contents are not a counter."""


def parse_state(text: str) -> tuple[int | None, str]:
    """`4: ACTIVE` -> (4, "ACTIVE"); a bare name keeps a nil id."""
    head, sep, tail = text.strip().partition(":")
    if sep and head.strip().isdigit():
        return int(head), tail.strip()
    return None, text.strip()


def parse_rate(text: str) -> float | None:
    """`100 Gb/sec (4X EDR)` -> bytes per second (12.5e9); None when unreadable."""
    m = _RATE_RE.match(text)
    if not m:
        return None
    return float(m.group(1)) * 1e9 / 8


def parse_counter(raw: bytes | str) -> int:
    """A sysfs counter: a non-negative integer. `N/A (no PMA)` and garbage raise."""
    try:
        n = int(raw)  # the common case, bytes or str, surrounding white space allowed
    except ValueError:
        pass
    else:
        if n < 0:
            raise CounterError(f"negative counter: {n}")
        return n
    text = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw
    value = text.strip()
    if value.startswith("N/A"):
        raise CounterError(value or "N/A")
    try:
        n = int(value, 0) if value.startswith("0x") else int(value)
    except ValueError:
        raise CounterError(f"not a counter: {value[:40]!r}") from None
    if n < 0:
        raise CounterError(f"negative counter: {n}")
    return n


@dataclass
class _Port:
    device: str
    port: str
    base: str
    # wire name -> (path, legacy width or None for 64-bit, scale)
    counters: dict[str, tuple[str, int | None, int]] = field(default_factory=dict)
    hw: list[str] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    prev: dict[str, int] = field(default_factory=dict)
    prev_t: float | None = None
    reasons: dict[str, str] = field(default_factory=dict)  # why a counter could not be read
    stuck: set[str] = field(default_factory=set)  # counters saturated when last read
    storms: int | None = None  # PFC storm events as last read (RoCE ports)
    # Cleaned: the id is what leaves the agent (wire, /metrics); paths use the raw
    # device name.
    id: str = ""
    # The rate counters alone (read every sample), and the error counters as last read,
    # carried between their reads.
    rate_counters: dict[str, tuple[str, int | None, int]] = field(default_factory=dict)
    carry_cur: dict[str, int] = field(default_factory=dict)
    carry_totals: dict[str, int | None] = field(default_factory=dict)
    carry_reasons: dict[str, str] = field(default_factory=dict)
    carry_stuck: list[str] = field(default_factory=list)
    # (name, path, read on the error cadence only)
    hw_paths: list[tuple[str, str, bool]] = field(default_factory=list)
    hw_prev: dict[str, tuple[int, float]] = field(default_factory=dict)  # (raw, when)
    hw_rates: dict[str, float | None] = field(default_factory=dict)  # as last read

    def __post_init__(self) -> None:
        self.id = clean(f"{self.device}:{self.port}")

    def set_counters(self, counters: dict[str, tuple[str, int | None, int]]) -> None:
        self.counters = counters
        self.rate_counters = {k: c for k, c in counters.items() if k not in _ERROR_SET}

    def widen(self, name: str) -> None:
        """A legacy counter found 64 bits wide: it no longer saturates."""
        path, _, scale = self.counters[name]
        self.set_counters({**self.counters, name: (path, None, scale)})

    def carry(self, cur: dict[str, int], totals: dict[str, int | None]) -> None:
        """The error counters as just read, to stand until their next read."""
        self.carry_cur = {k: n for k, n in cur.items() if k in _ERROR_SET}
        self.carry_totals = {k: n for k, n in totals.items() if k in _ERROR_SET}
        self.carry_reasons = {k: r for k, r in self.reasons.items() if k in _ERROR_SET}
        self.carry_stuck = [k for k in self.stuck if k in _ERROR_SET]


class StatsReader(Protocol):
    """What reads a netdev's driver statistics (agent.collectors.ethtool_stats)."""

    def read(self, ifname: str) -> dict[str, int]: ...

    def close(self) -> None: ...


class FabricCollector:
    """Discovers ports each sample (cheap) and reads their counters."""

    def __init__(self, files: FileTree, errors_every: int = ERRORS_EVERY,
                 ethtool: StatsReader | None = None) -> None:
        self.files = files
        # The driver statistics of RoCE ports' netdevs (PFC pauses, storms, discards):
        # the hardware boundary, so tests and the simulator give their own.
        self.ethtool: StatsReader = ethtool if ethtool is not None else EthtoolStats()
        self.errors_every = max(1, errors_every)
        self._rates = RateTracker()
        self._nic_rates = CounterSet()
        self._ports: dict[str, _Port] = {}
        self._nics: dict[str, dict[str, Any]] = {}
        self._paths = pci.PciPaths(files)  # each HCA's PCIe links up to its root port
        self._reads = 0
        self._info_changed = False
        self._lost = False  # a port's or NIC's files stopped answering: list again
        self._states: dict[bytes | str, tuple[int | None, str]] = {}  # text -> parsed
        self.status: str | None = None
        # Cumulative counters by port or NIC id, for /metrics. Kept off the wire: viewers
        # need rates, and a node's frame stays small. A port's counter that is there and
        # could not be read is None (its mark on /metrics); one with no file is absent.
        self.totals: dict[str, dict[str, int | None]] = {}
        self.hw_totals: dict[str, dict[str, int | None]] = {}
        self.nic_totals: dict[str, dict[str, int | None]] = {}
        # RoCE ports' lossless counters as last read (pause_summary), for /metrics.
        self.pause_totals: dict[str, dict[str, int]] = {}

    def close(self) -> None:
        self.ethtool.close()

    # -- inventory ---------------------------------------------------------------------

    def inventory(self) -> dict[str, list[dict[str, Any]]]:
        return {"ports": [dict(p.info) for p in self._ports.values()],
                "nics": [dict(n) for n in self._nics.values()]}

    def _discover(self) -> bool:
        """Refresh the port and NIC lists; True when they changed."""
        found: dict[str, _Port] = {}
        try:
            devices = self.files.listdir(IB)
            self.status = None
        except ReadError as exc:
            devices = []
            self.status = f"no InfiniBand/RoCE devices ({IB}: {exc.reason})"
        for dev in devices:
            try:
                ports = self.files.listdir(f"{IB}/{dev}/ports")
            except ReadError:
                continue
            for port in ports:
                key = f"{dev}:{port}"
                found[key] = self._ports.get(key) or self._new_port(dev, port)
        nics = self._discover_nics()
        changed = found.keys() != self._ports.keys() or nics.keys() != self._nics.keys()
        for gone in self._ports.keys() - found.keys():
            self.files.forget(self._ports[gone].base)
            self._rates.forget(gone)
        self._ports = found
        self._nics = nics
        return changed

    def _new_port(self, dev: str, port: str) -> _Port:
        base = f"{IB}/{dev}/ports/{port}"
        p = _Port(dev, port, base)
        try:
            ext = set(self.files.listdir(f"{base}/counters_ext"))
        except ReadError:
            ext = set()
        counters: dict[str, tuple[str, int | None, int]] = {}
        for c in PORT_COUNTERS_READ:
            if c.ext_file and c.ext_file in ext:
                counters[c.key] = (f"{base}/counters_ext/{c.ext_file}", None, c.scale)
            else:
                counters[c.key] = (f"{base}/counters/{c.file}", c.width, c.scale)
        p.set_counters(counters)
        try:
            present = set(self.files.listdir(f"{base}/hw_counters"))
        except ReadError:
            present = set()
        p.hw = [h for h in HW_COUNTERS if h in present]
        p.hw_paths = [(h, f"{base}/hw_counters/{h}", h in HW_ERROR_COUNTERS) for h in p.hw]
        netdevs: list[str] = []
        with contextlib.suppress(ReadError):
            netdevs = self.files.listdir(f"{IB}/{dev}/device/net")
        p.info = {"id": p.id, "device": dev, "port": int(port) if port.isdigit() else port,
                  "netdev": netdevs[0] if netdevs else None}
        self._read_port_info(p)
        return p

    def _read_port_info(self, p: _Port) -> bool:
        """The port's slow facts (rate, model, firmware, the HCA's PCIe link and the links
        above it); True when they changed since the last read (a port that came back at
        half its rate)."""
        def text(rel: str) -> str | None:
            try:
                return self.files.read_text(rel).strip() or None
            except ReadError:
                return None

        dev_base = f"{IB}/{p.device}"
        rate_text = text(f"{p.base}/rate")
        before = dict(p.info)
        p.info.update({
            "link_layer": text(f"{p.base}/link_layer"),
            "rate": parse_rate(rate_text) if rate_text else None,
            "rate_text": rate_text,
            "hca_type": text(f"{dev_base}/hca_type"),
            "board_id": text(f"{dev_base}/board_id"),
            "fw_ver": text(f"{dev_base}/fw_ver"),
            **pci.link(self.files, f"{dev_base}/device"),
            "pcie_path": self._path(f"{dev_base}/device"),
        })
        return p.info != before

    def _path(self, device_link: str) -> list[dict[str, Any]] | None:
        """The HCA's PCIe path with each link's state now: read on the cadence of its own
        link (every RATE_EVERY samples); an HCA keeps its link at speed, idle or not."""
        address = self.files.link_name(device_link)
        return self._paths.read(address, with_now=True) if address else None

    def _discover_nics(self) -> dict[str, dict[str, Any]]:
        try:
            names = self.files.listdir(NET)
        except ReadError:
            return {}
        out: dict[str, dict[str, Any]] = {}
        for name in names:
            if name == "lo" or not self.files.exists(f"{NET}/{name}/device"):
                continue  # loopback and virtual devices (bridges, veths, bonds' slaves' views)
            out[name] = self._nics.get(name) or {"id": clean(name)}
        return out

    # -- sampling ------------------------------------------------------------------------

    def collect(self, now: float) -> tuple[dict[str, Any], bool]:
        """One reading of every port and NIC; also says whether the inventory changed."""
        changed = False
        if self._lost or self._reads % DISCOVER_EVERY == 0:
            self._lost = False
            changed = self._discover()
        self._info_changed = False
        refresh = self._reads % RATE_EVERY == 0
        errors_due = self._reads % self.errors_every == 0
        self._reads += 1
        ports = [self._read_port(p, now, refresh, errors_due) for p in self._ports.values()]
        nics = [self._read_nic(name, info, now, refresh) for name, info in self._nics.items()]
        if changed:
            port_ids = {p.id for p in self._ports.values()}
            nic_ids = {n["id"] for n in self._nics.values()}
            for table, live in ((self.totals, port_ids), (self.hw_totals, port_ids),
                                (self.pause_totals, port_ids),
                                (self.nic_totals, nic_ids)):
                for key in list(table.keys() - live):
                    del table[key]
        return {"ports": ports, "nics": nics}, changed or self._info_changed

    def _read_raw(self, path: str) -> tuple[int | None, str | None]:
        """A counter's value, or None and the reason (fast path: one pread, one int())."""
        try:
            data = self.files.read_counter(path)
        except ReadError as exc:
            return None, exc.reason
        try:
            n = int(data)
            if n >= 0:
                return n, None
        except ValueError:
            pass
        try:
            return parse_counter(data), None
        except CounterError as exc:
            return None, str(exc)

    def _read_port(self, p: _Port, now: float, refresh: bool,
                   errors_due: bool = True) -> dict[str, Any]:
        if refresh and self._read_port_info(p):
            self._info_changed = True
        v: dict[str, Any] = {"id": p.id}
        errors: dict[str, str] = {}
        for name in ("state", "phys_state"):
            try:
                printed = self.files.read_counter(f"{p.base}/{name}")
                parsed = self._states.get(printed)
                if parsed is None:
                    parsed = parse_state(_text(printed))
                    if len(self._states) < 64:  # a handful of states, as the kernel prints
                        self._states[printed] = parsed
                num, label = parsed
            except ReadError as exc:
                num, label = None, None
                errors[name] = exc.reason
                self._lost = True  # gone, or going: see at the next sample
            v[name] = num
            v[f"{name}_name"] = label
        # Whether the port is up goes in the inventory: only an up port's rate is a rate
        # (a Down port reads `40`), and the fleet compares the rates of the inventories.
        up = None if v["state"] is None else int(port_up(v["state"], v["phys_state"]))
        if p.info.get("up") != up:
            p.info["up"] = up
            self._info_changed = True
        netdev = p.info.get("netdev")
        if up == 0 and netdev and p.info.get("link_layer") == "Ethernet":
            v["admin_up"] = self._admin_up(netdev, errors)
        # Every counter of a port is read at the same moment: one elapsed time for all.
        dt = now - p.prev_t if p.prev_t is not None else 0.0
        prev, cur = p.prev, {}
        read_errors = errors_due or p.prev_t is None or up != 1  # not up: each sample
        totals: dict[str, int | None] = {}
        increments: dict[str, int | None] = {}
        saturated: list[str] = []
        if read_errors:
            counters = p.counters
        else:
            # The error counters as last read, carried whole: read every errors_every
            # samples, they cost nothing in between.
            counters = p.rate_counters
            cur.update(p.carry_cur)
            totals.update(p.carry_totals)
            errors.update(p.carry_reasons)
            saturated.extend(p.carry_stuck)
        reasons, stuck, read = p.reasons, p.stuck, self._read_raw
        for name, (path, width, scale) in counters.items():
            is_error = name in _ERROR_SET
            raw, reason = read(path)
            reasons.pop(name, None)
            if raw is None:
                there = reason != MISSING  # no file: nothing to count, ever
                if there:  # and unreadable: None (its mark on /metrics); no file: absent
                    totals[name] = None
                errors[name] = reasons[name] = reason or "unreadable"
                stuck.discard(name)  # not known to be stuck now
                if not is_error:
                    v[f"{name}_s"] = None
                elif there:  # could not be counted (a port with no file of it has none)
                    increments[name] = None
                continue
            cur[name] = raw
            totals[name] = raw * scale
            if width is not None and raw >= 1 << width:
                # Wider than the legacy PMA counter: the kernel shows the extended
                # 64-bit counter in this file, which does not saturate.
                p.widen(name)
                width = None
            is_saturated = width is not None and raw == (1 << width) - 1
            if is_saturated:
                saturated.append(name)
                stuck.add(name)
            else:
                stuck.discard(name)
            before = prev.get(name)
            # Unknown when saturated, read for the first time, or reset.
            delta = None if is_saturated or before is None or raw < before else raw - before
            if is_error:
                increments[name] = delta
            else:
                v[f"{name}_s"] = None if delta is None or dt <= 0 else delta * scale / dt
        if read_errors:
            p.carry(cur, totals)
        p.prev, p.prev_t = cur, now
        rate = p.info.get("rate")
        tx, rx = v.get("tx_bytes_s"), v.get("rx_bytes_s")
        v["tx_util"] = link_util(tx, rate)
        v["rx_util"] = link_util(rx, rate)
        # Only counters that moved or could not be counted: most ports, most seconds, none.
        moved = {k: n for k, n in increments.items() if n != 0}
        if moved:
            v["errors_inc"] = moved
        self.totals[p.id] = totals
        if saturated:
            v["saturated"] = saturated
        if p.hw_paths:
            v["hw"] = self._read_hw(p, now, errors, read_errors)
        if netdev and p.info.get("link_layer") == "Ethernet":
            self._read_pauses(p, v, netdev, now, dt, errors)
        if errors:
            v["counter_errors"] = errors
        return v

    def _read_hw(self, p: _Port, now: float, errors: dict[str, str],
                 errors_due: bool) -> dict[str, float | None]:
        """The mlx5 hw_counters' rates: 32-bit counters that wrap (a decrease is one wrap);
        one that cannot be read is nil with its reason, and its next read starts again.
        The sequence-error and retransmission counters are read when the port's error
        counters are, their last rate standing between."""
        hw: dict[str, float | None] = {}
        # A new map each sample, put in place whole: /metrics reads it on another thread.
        last_totals = self.hw_totals.get(p.id, {})
        totals: dict[str, int | None] = {}
        prev, rates = p.hw_prev, p.hw_rates
        read = self._read_raw
        for name, path, slow in p.hw_paths:
            if slow and not errors_due and name in rates:
                hw[name] = rates[name]
                totals[name] = last_totals.get(name)
                if totals[name] is None and name in p.reasons:
                    errors[name] = p.reasons[name]
                continue
            raw, reason = read(path)
            totals[name] = raw
            rate = None
            if raw is None:
                prev.pop(name, None)
                errors[name] = p.reasons[name] = reason or "unreadable"
            else:
                p.reasons.pop(name, None)
                before = prev.get(name)
                prev[name] = (raw, now)
                if before is not None:
                    rate = counter_rate(before[0], raw, now - before[1], wrap_bits=32)
            hw[name] = rates[name] = rate
        self.hw_totals[p.id] = totals
        return hw

    def _admin_up(self, netdev: str, errors: dict[str, str]) -> int | None:
        """1 when a RoCE port's netdev is administratively up (IFF_UP in its sysfs
        `flags`), 0 when someone set it down: the RDMA port reads Disabled both ways, and
        only this tells a port turned off from one that lost its carrier."""
        try:
            return int(self.files.read_text(f"{NET}/{netdev}/flags").strip(), 16) & 1
        except (ReadError, ValueError) as exc:
            errors["admin_up"] = exc.reason if isinstance(exc, ReadError) else \
                "flags: not a number"
            return None

    def _read_pauses(self, p: _Port, v: dict[str, Any], netdev: str, now: float, dt: float,
                     errors: dict[str, str]) -> None:
        """A RoCE port's lossless health from its netdev's driver statistics: pause frames
        each way, the share of the interval it was held off by its peer (`paused_rx`) or
        held its peer off (`paused_tx`) and by which kind of pause (`pause_by`), the
        priorities with PFC on, PFC storm events, and the packets dropped for lack of
        buffer with what arrived (all priorities, and the PFC ones: the lossless
        traffic), each drop counted once (ethtool_stats.PauseSummary)."""
        try:
            summary = pause_summary(self.ethtool.read(netdev))
        except OSError as exc:
            errors["ethtool"] = str(exc)
            self.pause_totals.pop(p.id, None)
            return
        totals = summary.totals
        self.pause_totals[p.id] = totals
        key = (p.id, "pause")

        def rate(name: str) -> float | None:
            return self._rates.rate((*key, name), totals.get(name), now)

        for name, wire in (("pause_rx", "pause_rx_s"), ("pause_tx", "pause_tx_s"),
                           *((n, f"{n}_s") for n in DROP_TOTALS)):
            v[wire] = rate(name)
        for name, wire in (("pause_rx_us", "paused_rx"), ("pause_tx_us", "paused_tx")):
            per_s = rate(name)
            v[wire] = None if per_s is None else min(1.0, per_s / 1e6)
        # Which pause this port sent: PFC or global, by whose durations moved (mlx5 can
        # list both kinds; the words of a finding must name the one that held the peer).
        moved = [kind for kind in ("pfc", "global") if (rate(f"pause_tx_us_{kind}") or 0) > 0]
        v["pause_by"] = "+".join(moved) or None
        v["pfc"] = list(summary.pfc)
        storms = (totals.get("storm_warning") or 0) + (totals.get("storm_error") or 0) \
            if "storm_warning" in totals or "storm_error" in totals else None
        before = p.storms
        p.storms = storms
        if storms is not None and before is not None and storms > before:
            v["pause_storms"] = storms - before

    def _read_nic(self, name: str, info: dict[str, Any], now: float,
                  refresh: bool) -> dict[str, Any]:
        base = f"{NET}/{name}"
        if refresh:
            try:
                speed = int(self.files.read_text(f"{base}/speed").strip())
                info["speed"] = speed * 1e6 / 8 if speed > 0 else None  # Mb/s to bytes/s
            except (ReadError, ValueError):
                info["speed"] = None  # down links print -1 or fail with EINVAL
        v: dict[str, Any] = {"id": info["id"]}
        try:
            v["operstate"] = _text(self.files.read_counter(f"{base}/operstate")).strip()
        except ReadError:
            v["operstate"] = None
            self._lost = True
        totals: dict[str, int | None] = {}
        for c in NIC_COUNTERS_READ:
            raw, reason = self._read_raw(f"{base}/{c.file}")
            totals[c.key] = raw
            if reason:
                v.setdefault("counter_errors", {})[c.key] = reason
        # The NIC's counters as one read: one remembered read a NIC (rates.CounterSet).
        for c, r in zip(NIC_COUNTERS_READ,
                        self._nic_rates.rates(name, tuple(totals.values()), now)):
            v[f"{c.key}_s"] = r
        self.nic_totals[info["id"]] = totals
        link_speed = info.get("speed")
        v["rx_util"] = link_util(v["rx_bytes_s"], link_speed)
        v["tx_util"] = link_util(v["tx_bytes_s"], link_speed)
        return v
