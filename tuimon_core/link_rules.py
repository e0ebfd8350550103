"""The links inside a node, judged where its data is: the PCIe link of each GPU and HCA
and the links above it up to its root port (through PCIe switches), the NVLinks, the
GPUs the PCI bus has but NVML does not, the GPUDirect RDMA module. The gray failures:
nothing is down, and the node is slow. Judged from what is on the wire (the hello's
`pcie_path`, a sample's `pcie_path_gen`), so a viewer or relay judges an agent that does
not judge itself the same way.

Thresholds and where they come from:
- PCIe downtrained, the device's own link: a GPU's below the generation or width it and
  its slot support together (NVML's `Max`), judged only while the GPU is busy (an idle
  GPU drops its link to save power); an HCA's below the lower of its own and its slot's
  `max_link_speed`/`max_link_width` (sysfs; a Gen5 HCA in a Gen4 slot trains at Gen4,
  as it should), judged always. Agents that send no path: the HCA's own maximum.
- PCIe downtrained, a link above the device (its `pcie_path`: switch to root port, one
  switch to another): below the lower of its two ends' maxima, the most the link can
  train at (as the kernel's `pcie_bandwidth_available` walks the same path). A link that
  carries a GPU is judged only while a GPU behind it is busy (an idle GPU lowers its
  link, and the ports above it may follow); one that carries HCAs only, always. One
  finding per link, naming the devices behind it. A switch port shown "downgraded" by
  lspci because the device below supports less (a Gen4 NIC under a Gen5 switch) is not
  below what both ends support: nothing.
- PCIe slot limited (info, configuration): a port on the path (the slot, a switch's
  ports, the root port) that supports less than the device itself (sysfs
  `max_link_*` of the device), so the device cannot reach its own maximum: a Gen5 GPU
  or HCA in a Gen4 slot. Not a fault: the link is as fast as its ends allow. The fleet
  compares what each model's path allows (`tuimon_core/fleet.py`).
- PCIe replays: more per minute than DCGM's health watch allows, `ceil(rate x lanes)`
  with the per-lane rate by generation 0.15, 0.3, 0.48, 0.96, 1.92, 3.84 a minute
  (a bit error rate of 1e-12 at the line rate; DCGM's DcgmHealthWatch.cpp,
  GetExpectedPcieReplayRate): Gen5 x16 allows 31 a minute.
- NVLink errors: any recovery (a link retrained) or replay in the window, or CRC errors
  at 100 a second or more (DCGM's DCGM_LIMIT_MAX_NVLINK_ERROR = 1 and
  DCGM_LIMIT_MAX_NVLINK_CRC_ERROR = 100/s).
- Fewer NVLinks active than the GPU itself had while judged here (a link lost on a
  bridged pair of H100 PCIe: 11 of 18 where it had 12), or than the node's other GPUs
  of the same model: a model whose bridges simply have fewer links (H100 PCIe with a
  bridge: 12 of 18 on every GPU) has them on every GPU, and is not a finding. The fleet
  comparison (tuimon_core.fleet) names a node whose GPUs have fewer than the fleet's
  same model, for an agent started after the loss.
- GPUs on the PCI bus that NVML does not list (the driver dropped one), or none usable
  at all (NVML cannot load: "NVML Shared Library Not Found", no driver): critical.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Literal

from tuimon_core.findings import Finding
from tuimon_core.gpu_state import gpu_work
from tuimon_core.protocol.row_access import gpu_rows, port_info_rows
from tuimon_core.protocol.rows import GpuRow, PcieHopRow, PortInfoRow

BUSY_FOR_LINK = 0.5  # a GPU this busy keeps its link at full speed
# GT/s per lane by PCIe generation (index: generation - 1): what a link's bandwidth is
# compared by (lanes x rate; the encoding's overhead is alike within Gen3 and later).
GT_PER_LANE = (2.5, 5.0, 8.0, 16.0, 32.0, 64.0)
# DCGM's allowed PCIe replays a minute per lane, by generation (index: generation - 1).
REPLAYS_PER_LANE_MINUTE = (0.15, 0.3, 0.48, 0.96, 1.92, 3.84)
REPLAY_WINDOW_S = 60.0
NVLINK_WINDOW_S = 600.0
NVLINK_CRC_PER_S = 100.0
MIN_SPAN_S = 30.0  # a rate over less than this is not judged
# A GPU's link counters (totals) whose growth the rules judge over their windows.
LINK_TOTALS: tuple[Literal["pcie_replays", "nvlink_replay_errors", "nvlink_recovery_errors",
                           "nvlink_crc_errors"], ...] = (
    "pcie_replays", "nvlink_replay_errors", "nvlink_recovery_errors", "nvlink_crc_errors")
_LINK_KEYS = frozenset(LINK_TOTALS)


def bus_address(text: str) -> str | None:
    """A PCI address in one form for comparing: NVML's `00000000:18:00.0` and sysfs's
    `0000:18:00.0` both become `0000:18:00.0` (lower case)."""
    parts = text.strip().lower().split(":")
    if len(parts) != 3:
        return None
    domain, bus, devfn = parts
    try:
        return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{devfn}"
    except ValueError:
        return None


Link = tuple[int | None, int | None]  # (generation, width); None: not known


def _known(value: int | None) -> int | None:
    return value if type(value) is int and value > 0 else None


def _lower(a: int | None, b: int | None) -> int | None:
    """The lower of two maxima; not known where either is not."""
    a, b = _known(a), _known(b)
    return None if a is None or b is None else min(a, b)


def hop_most(hop: PcieHopRow) -> Link:
    """The most a link on a PCIe path can train at: the lower of its two ends' maxima."""
    return (_lower(hop.get("up_gen_max"), hop.get("down_gen_max")),
            _lower(hop.get("up_width_max"), hop.get("down_width_max")))


def bandwidth(link: Link) -> float | None:
    """GT/s over all lanes: how links of other generations and widths compare."""
    gen, width = link
    if gen is None or width is None:
        return None
    return GT_PER_LANE[min(gen, len(GT_PER_LANE)) - 1] * width


def path_most(hops: Any) -> Link | None:
    """The narrowest link on a device's path, by what each can train at: the most the
    device can get through it (None where no link's ends are known)."""
    known = [(bw, most) for most in map(hop_most, hops or ())
             if (bw := bandwidth(most)) is not None]
    return min(known)[1] if known else None


def _below(now: Link, most: Link) -> bool:
    """Below in generation or width, where both are known."""
    return any(n is not None and m is not None and n < m
               for n, m in zip(map(_known, now), most))


def link_text(link: Link) -> str:
    gen, width = link
    return f"Gen{gen if gen is not None else '?'} x{width if width is not None else '?'}"


def allowed_replays(gen: int | None, width: int | None) -> int | None:
    """DCGM's most PCIe replays a minute for a link of this generation and width."""
    if not gen or not width:
        return None
    return math.ceil(REPLAYS_PER_LANE_MINUTE[min(gen, 6) - 1] * width)


def _growth(q: deque[tuple[float, int]], now: float, span: float) -> tuple[int, float]:
    """(how much a total grew, over how many seconds) within the last `span`."""
    while len(q) > 1 and q[1][0] <= now - span:
        q.popleft()
    if len(q) < 2:
        return 0, 0.0
    return q[-1][1] - q[0][1], q[-1][0] - q[0][0]


@dataclass(frozen=True, slots=True)
class _PathOf:
    """A device's PCIe path as the path rules judge it."""

    name: str  # `GPU 2`, `mlx5_0`: how a finding names it
    gpu: int | None
    port: str | None
    hops: tuple[PcieHopRow, ...]  # its own link first, then up to the root port
    now: tuple[Link, ...]  # each link's state now, in the same order
    busy: bool | None  # a GPU: busy now; an HCA: None (its links are judged always)

    @property
    def own(self) -> Link:
        """What the device itself supports (its end of its own link)."""
        return (_known(self.hops[0].get("down_gen_max")),
                _known(self.hops[0].get("down_width_max")))


def _gpu_paths(infos: list[Any], gpus: list[GpuRow]) -> list[_PathOf]:
    out = []
    for i, info in enumerate(infos):
        hops = getattr(info, "pcie_path", None)
        g = gpus[i] if i < len(gpus) else None
        if not hops or g is None or g.get("failed"):
            continue
        gens, widths = g.get("pcie_path_gen") or (), g.get("pcie_path_width") or ()
        # A sample read against another path than the hello's: its links not known.
        now = tuple(zip(gens, widths)) if len(gens) == len(widths) == len(hops) else \
            ((None, None),) * len(hops)
        busy = gpu_work(g, info)[0]
        out.append(_PathOf(f"GPU {i}", i, None, tuple(hops), now,
                           busy is not None and busy >= BUSY_FOR_LINK))
    return out


def _hca_paths(ports: list[PortInfoRow]) -> list[_PathOf]:
    out = []
    for device, p in _hcas(ports):
        hops = p.get("pcie_path")
        if hops:
            out.append(_PathOf(str(device), None, str(device), tuple(hops),
                               tuple((h.get("gen"), h.get("width")) for h in hops), None))
    return out


def _hcas(ports: list[PortInfoRow]) -> list[tuple[Any, PortInfoRow]]:
    """(device, its first port's facts) for each HCA: its ports share its PCIe link."""
    seen: dict[Any, PortInfoRow] = {}
    for p in ports:
        seen.setdefault(p.get("device") or p.get("id"), p)
    return list(seen.items())


def _port_name(hop: PcieHopRow, upper: bool) -> str:
    """An end of a link above a device, in words: the port above, or (the lower end of a
    link above the device's own) a switch's upstream port."""
    if not upper:
        return f"switch upstream port {hop.get('down')}"
    return f"{'root' if hop.get('up_kind') == 'root' else 'switch'} port {hop.get('up')}"


def _end(hop: PcieHopRow, upper: bool) -> tuple[str, Link]:
    """An end of a link: the port above (`upper`) or the device below, as (its address,
    the most it supports)."""
    if upper:
        return str(hop.get("up")), (_known(hop.get("up_gen_max")),
                                    _known(hop.get("up_width_max")))
    return str(hop.get("down")), (_known(hop.get("down_gen_max")),
                                  _known(hop.get("down_width_max")))


def _narrowest_end(p: _PathOf) -> tuple[str, str, Link] | None:
    """(address, name, maxima) of the port on the device's path that supports least
    below what the device does, if any: the upper end of each link, and the lower end
    (a switch's upstream port) of each link above its own."""
    own = p.own
    ends = []
    for k, hop in enumerate(p.hops):
        for upper in (True, False) if k else (True,):
            address, most = _end(hop, upper)
            if _below(most, own):
                # Ranked by what it lets through; a maximum not known is taken as the
                # device's own.
                gen, width = (m if m is not None else o for m, o in zip(most, own))
                ends.append((bandwidth((gen, width)) or 0.0, address,
                             _port_name(hop, upper), most))
    if not ends:
        return None
    _, address, name, most = min(ends, key=lambda end: (end[0], end[1]))
    return address, name, most


@dataclass
class LinkRules:
    """One node's link windows, fed each sample."""

    name: str
    _totals: dict[tuple[int, str], deque[tuple[float, int]]] = field(default_factory=dict)
    # GPU (uuid, else index) -> the most NVLinks it has had active while judged here
    _nvlinks_most: dict[str, int] = field(default_factory=dict)
    # The hello last judged, with its HCAs' paths and the findings it alone says.
    _hello_seen: tuple[Any, list[_PathOf], list[Finding], list[Finding]] | None = None

    def observe(self, sample: Any, now: float) -> None:
        for i, g in enumerate(gpu_rows(sample)):
            if _LINK_KEYS.isdisjoint(g):
                continue  # no link counter read on this GPU (Prometheus without them)
            for key in LINK_TOTALS:
                value: int | None = g.get(key)
                if not isinstance(value, int):
                    continue
                q = self._totals.setdefault((i, key), deque())
                if q and value < q[-1][1]:
                    q.clear()  # the counter was reset (driver reload): start over
                q.append((now, value))

    def conditions(self, hello: Any, sample: Any, now: float) -> list[Finding]:
        out: list[Finding] = []
        infos = list(hello.gpus) if hello is not None else []
        gpus = gpu_rows(sample)
        out += self._gpu_links(infos, gpus, now)
        if hello is not None:
            hcas, before, after = self._of_hello(hello, infos)
            paths = _gpu_paths(infos, gpus) + hcas
            # In this order: an HCA's own link and its path's can share a finding's key,
            # and the book keeps the last one's words.
            out += before
            out += self._path_links(paths)
            out += self._slots(paths)
            out += after
        return out

    def _of_hello(self, hello: Any, infos: list[Any]
                  ) -> tuple[list[_PathOf], list[Finding], list[Finding]]:
        """The HCAs' paths and what the hello alone says (NVLinks present, the HCAs'
        links, GPUs on the bus, GPUDirect): judged again only when a new hello comes (a
        node's hello stands for minutes, its samples come every second; at a thousand
        nodes through Prometheus these were a fifth of each pass)."""
        held = self._hello_seen
        if held is not None and held[0] is hello:
            return held[1], held[2], held[3]
        hcas = _hca_paths(port_info_rows(hello))
        before = self._nvlinks_present(infos) + self._hca_links(hello)
        after = self._gpus_on_bus(hello) + self._gpudirect(hello)
        self._hello_seen = (hello, hcas, before, after)
        return hcas, before, after

    # -- rules ------------------------------------------------------------------------

    def _gpu_links(self, infos: list[Any], gpus: list[GpuRow],
                   now: float) -> list[Finding]:
        node = self.name
        out = []
        totals = self._totals
        for i, g in enumerate(gpus):
            if g.get("failed"):
                continue
            gen, width = g.get("pcie_gen"), g.get("pcie_width")
            if not (gen or width or totals):
                continue  # no link read on this GPU (Prometheus without them): nothing to judge
            info = infos[i] if i < len(infos) else None
            gmax = getattr(info, "pcie_gen_max", None)
            wmax = getattr(info, "pcie_width_max", None)
            if (gen and gmax and gen < gmax) or (width and wmax and width < wmax):
                busy, by = gpu_work(g, info)
                if busy is not None and busy >= BUSY_FOR_LINK:
                    # Busy as utilization says, unless it cannot (MIG): then say how known.
                    how = f" ({by})" if by not in (None, "util", "SM active") else ""
                    out.append(Finding(
                        "warning", "pcie_downtrained",
                        f"{node} GPU {i} PCIe Gen{gen} x{width} while busy{how}, of "
                        f"Gen{gmax} x{wmax}: copies to and from the GPU run slower",
                        node=node, gpu=i, score=0.6))
            if not totals:  # no link counter read on this node: nothing grew
                continue
            where = f"{node} GPU {i}"
            q = totals.get((i, "pcie_replays"))
            limit = allowed_replays(gen, width)
            if q and limit is not None:
                grew, span = _growth(q, now, REPLAY_WINDOW_S)
                if span >= MIN_SPAN_S and grew * 60.0 / span > limit:
                    out.append(Finding(
                        "warning", "pcie_replays",
                        f"{where} {grew * 60.0 / span:.0f} PCIe replays a minute, above the "
                        f"{limit} DCGM allows for Gen{gen} x{width}: a marginal link",
                        node=node, gpu=i, score=0.4))
            parts = []
            for key, span_s, words in (("nvlink_recovery_errors", NVLINK_WINDOW_S,
                                        "recovery errors in 10 min"),
                                       ("nvlink_replay_errors", REPLAY_WINDOW_S,
                                        "replay errors in the last minute")):
                q = totals.get((i, key))
                if q:
                    grew, _ = _growth(q, now, span_s)
                    if grew >= 1:
                        parts.append(f"+{grew} {words}")
            q = totals.get((i, "nvlink_crc_errors"))
            if q:
                grew, span = _growth(q, now, REPLAY_WINDOW_S)
                if span >= MIN_SPAN_S and grew / span >= NVLINK_CRC_PER_S:
                    parts.append(f"{grew / span:,.0f} CRC errors a second")
            if parts:
                out.append(Finding("warning", "nvlink_errors",
                                   f"{where} NVLink {', '.join(parts)}", node=node, gpu=i,
                                   score=0.5))
        return out

    def _nvlinks_present(self, infos: list[Any]) -> list[Finding]:
        """A GPU with fewer NVLinks up than it had itself (the most it has had while
        judged here: a pair bridged by one NVLink bridge has no majority to lose to), or
        than most of the node's GPUs of its model."""
        by_model: dict[str, list[Any]] = {}
        out = []
        for info in infos:
            links = getattr(info, "nvlinks", None)
            if links is None or not info.name:
                continue
            by_model.setdefault(info.name, []).append(info)
            key = info.uuid or str(info.index)
            most = self._nvlinks_most.get(key, links)
            self._nvlinks_most[key] = max(most, links)
            if links < most:
                out.append(Finding(
                    "warning", "nvlink_down",
                    f"{self.name} GPU {info.index}: {links} of {info.nvlinks_total} NVLinks "
                    f"active; it had {most}", node=self.name, gpu=info.index, score=0.6))
        lost = {f.gpu for f in out}
        for model, same in by_model.items():
            if len(same) < 2:
                continue
            usual, count = Counter(g.nvlinks for g in same).most_common(1)[0]
            if count * 2 <= len(same):
                continue  # no majority to compare with
            for g in same:
                if g.nvlinks < usual and g.index not in lost:
                    out.append(Finding(
                        "warning", "nvlink_down",
                        f"{self.name} GPU {g.index}: {g.nvlinks} of {g.nvlinks_total} NVLinks "
                        f"active; the node's other {model} GPUs have {usual}",
                        node=self.name, gpu=g.index, score=0.6))
        return out

    def _hca_links(self, hello: Any) -> list[Finding]:
        out = []
        for device, p in _hcas(port_info_rows(hello)):
            gen, width = p.get("pcie_gen"), p.get("pcie_width")
            gmax, wmax = p.get("pcie_gen_max"), p.get("pcie_width_max")
            hops = p.get("pcie_path")
            slot: PcieHopRow = hops[0] if hops else {}
            # Its link at most is the lower of its own and its slot's, where known.
            gmax = _lower(gmax, slot.get("up_gen_max")) or gmax
            wmax = _lower(wmax, slot.get("up_width_max")) or wmax
            if (gen and gmax and gen < gmax) or (width and wmax and width < wmax):
                out.append(Finding(
                    "warning", "pcie_downtrained",
                    f"{self.name} {device} PCIe Gen{gen} x{width}, of Gen{gmax} x{wmax}: the "
                    "HCA cannot reach its line rate", node=self.name, port=str(device),
                    score=0.6))
        return out

    def _path_links(self, paths: list[_PathOf]) -> list[Finding]:
        """Each link above a device (its own is judged by `_gpu_links`, `_hca_links`)
        below what both its ends support; one finding per link, for the devices behind
        it."""
        behind: dict[tuple[Any, Any], list[tuple[_PathOf, PcieHopRow, Link]]] = {}
        for p in paths:
            for hop, now in zip(p.hops[1:], p.now[1:]):
                behind.setdefault((hop.get("up"), hop.get("down")), []).append((p, hop, now))
        out = []
        for devices in behind.values():
            gpus = [d for d in devices if d[0].busy is not None]
            # A link that carries a GPU is judged while one behind it is busy, with that
            # GPU's reading (taken every sample); an HCA's link always.
            judges = [d for d in gpus if d[0].busy] if gpus else devices
            if not judges:
                continue
            p, hop, now = judges[0]
            most = hop_most(hop)
            if not _below(now, most):
                continue
            busy = " while busy" if p.busy else ""
            out.append(self._on_path(
                "warning", "pcie_downtrained", p, [d[0] for d in devices if d[0] is not p],
                f"{_port_name(hop, True)} -> {hop.get('down')} at {link_text(now)} of "
                f"{link_text(most)}{busy}", score=0.6))
        return out

    def _slots(self, paths: list[_PathOf]) -> list[Finding]:
        """A port on a device's path that supports less than the device (a Gen5 GPU in
        a Gen4 slot): configuration, said once per port for the devices below it."""
        below: dict[str, list[tuple[_PathOf, str, Link]]] = {}
        for p in paths:
            limit = _narrowest_end(p)
            if limit is not None:
                address, where, most = limit
                below.setdefault(address, []).append((p, where, most))
        out = []
        for devices in below.values():
            p, where, most = devices[0]
            out.append(self._on_path(
                "info", "pcie_slot_limited", p, [d[0] for d in devices[1:]],
                f"{where} supports {link_text(most)}, {p.name} {link_text(p.own)}: it "
                "cannot reach its own maximum", score=0.3))
        return out

    def _on_path(self, severity: str, kind: str, p: _PathOf, others: list[_PathOf],
                 what: str, score: float) -> Finding:
        """A finding about a device's path, on the device, naming the others behind the
        same port (one finding, not one a device)."""
        also = f" (also behind it: {', '.join(o.name for o in others)})" if others else ""
        return Finding(severity, kind, f"{self.name} {p.name} PCIe path: {what}{also}",
                       node=self.name, gpu=p.gpu, port=p.port, score=score)

    def _gpus_on_bus(self, hello: Any) -> list[Finding]:
        on_bus = [a for a in (bus_address(x) for x in hello.extra.get("pci_gpus") or ())
                  if a is not None]
        if not on_bus:
            return []
        if not hello.gpus:  # NVML cannot start (no library, no driver): none usable
            why = hello.gpu_status or "NVML lists none"
            return [Finding("critical", "gpu_missing",
                            f"{self.name}: {len(on_bus)} GPU{'s' if len(on_bus) != 1 else ''} "
                            f"on the PCI bus, none usable: {why}", node=self.name,
                            score=0.6)]
        seen = {bus_address(g.pci_bus_id or "") for g in hello.gpus}
        missing = [a for a in on_bus if a not in seen]
        if not missing:
            return []
        visible = len(on_bus) - len(missing)
        return [Finding("critical", "gpu_missing",
                        f"{self.name}: {visible} of {len(on_bus)} GPUs visible to NVML: "
                        f"{', '.join(missing)} missing (on the PCI bus, not in NVML)",
                        node=self.name, score=0.6)]

    def _gpudirect(self, hello: Any) -> list[Finding]:
        if hello.extra.get("gpudirect") != "none" or not hello.gpus or \
                not hello.extra.get("ports"):
            return []
        return [Finding("info", "gpudirect_off",
                        f"{self.name}: no GPUDirect RDMA module loaded (nvidia_peermem): the "
                        "NICs reach GPU memory through the host unless NCCL uses DMA-BUF "
                        "(open kernel modules, kernel 5.12 or later)",
                        node=self.name, score=0.2)]
