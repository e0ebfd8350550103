"""The links inside a node, judged where its data is: the PCIe link of each GPU and HCA,
the NVLinks, the GPUs the PCI bus has but NVML does not, the GPUDirect RDMA module. The
gray failures: nothing is down, and the node is slow.

Thresholds and where they come from:
- PCIe downtrained: a GPU's link below the generation or width it and its slot support
  together (NVML's `Max`), judged only while the GPU is busy (an idle GPU drops its
  link to save power); an HCA's below its `max_link_speed`/`max_link_width` (sysfs).
  Bridges and switch ports are never read (a Gen5 GPU under a Gen4 switch shows the
  switch port "downgraded", which is normal).
- PCIe replays: more per minute than DCGM's health watch allows, `ceil(rate x lanes)`
  with the per-lane rate by generation 0.15, 0.3, 0.48, 0.96, 1.92, 3.84 a minute
  (a bit error rate of 1e-12 at the line rate; DCGM's DcgmHealthWatch.cpp,
  GetExpectedPcieReplayRate): Gen5 x16 allows 31 a minute.
- NVLink errors: any recovery (a link retrained) or replay in the window, or CRC errors
  at 100 a second or more (DCGM's DCGM_LIMIT_MAX_NVLINK_ERROR = 1 and
  DCGM_LIMIT_MAX_NVLINK_CRC_ERROR = 100/s).
- Fewer NVLinks active than the node's other GPUs of the same model: a model whose
  bridges simply have fewer links (H100 PCIe with a bridge: 12 of 18 on every GPU) has
  them on every GPU, and is not a finding.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from tuimon_core.findings import Finding
from tuimon_core.heat_levels import gpu_busy

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


@dataclass
class LinkRules:
    """One node's link windows, fed each sample."""

    name: str
    _totals: dict[tuple[int, str], deque[tuple[float, int]]] = field(default_factory=dict)

    def observe(self, sample: Any, now: float) -> None:
        for i, g in enumerate(sample.gpus or ()):
            for key in ("pcie_replays", "nvlink_replay_errors", "nvlink_recovery_errors",
                        "nvlink_crc_errors"):
                value = g.get(key)
                if not isinstance(value, int):
                    continue
                q = self._totals.setdefault((i, key), deque())
                if q and value < q[-1][1]:
                    q.clear()  # the counter was reset (driver reload): start over
                q.append((now, value))

    def conditions(self, hello: Any, sample: Any, now: float) -> list[Finding]:
        out: list[Finding] = []
        infos = list(hello.gpus) if hello is not None else []
        gpus = sample.gpus or []
        out += self._gpu_links(infos, gpus, now)
        if hello is not None:
            out += self._nvlinks_present(infos)
            out += self._hca_links(hello)
            out += self._gpus_on_bus(hello)
            out += self._gpudirect(hello)
        return out

    # -- rules ------------------------------------------------------------------------

    def _gpu_links(self, infos: list[Any], gpus: list[dict[str, Any]],
                   now: float) -> list[Finding]:
        node = self.name
        out = []
        totals = self._totals
        for i, g in enumerate(gpus):
            if g.get("failed"):
                continue
            info = infos[i] if i < len(infos) else None
            gen, width = g.get("pcie_gen"), g.get("pcie_width")
            gmax = getattr(info, "pcie_gen_max", None)
            wmax = getattr(info, "pcie_width_max", None)
            if ((gen and gmax and gen < gmax) or (width and wmax and width < wmax)) and (
                    (busy := gpu_busy(g)[0]) is not None and busy >= BUSY_FOR_LINK):
                out.append(Finding(
                    "warning", "pcie_downtrained",
                    f"{node} GPU {i} PCIe Gen{gen} x{width} while busy, of Gen{gmax} x{wmax}: "
                    "copies to and from the GPU run slower", node=node, gpu=i, score=0.6))
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
        """A GPU with fewer NVLinks up than most of the node's GPUs of its model."""
        by_model: dict[str, list[Any]] = {}
        for info in infos:
            if getattr(info, "nvlinks", None) is not None and info.name:
                by_model.setdefault(info.name, []).append(info)
        out = []
        for model, same in by_model.items():
            if len(same) < 2:
                continue
            usual, count = Counter(g.nvlinks for g in same).most_common(1)[0]
            if count * 2 <= len(same):
                continue  # no majority to compare with
            for g in same:
                if g.nvlinks < usual:
                    out.append(Finding(
                        "warning", "nvlink_down",
                        f"{self.name} GPU {g.index}: {g.nvlinks} of {g.nvlinks_total} NVLinks "
                        f"active; the node's other {model} GPUs have {usual}",
                        node=self.name, gpu=g.index, score=0.6))
        return out

    def _hca_links(self, hello: Any) -> list[Finding]:
        out = []
        seen = set()
        for p in hello.extra.get("ports") or ():
            device = p.get("device") or p.get("id")
            if device in seen:
                continue
            seen.add(device)
            gen, width = p.get("pcie_gen"), p.get("pcie_width")
            gmax, wmax = p.get("pcie_gen_max"), p.get("pcie_width_max")
            if (gen and gmax and gen < gmax) or (width and wmax and width < wmax):
                out.append(Finding(
                    "warning", "pcie_downtrained",
                    f"{self.name} {device} PCIe Gen{gen} x{width}, of Gen{gmax} x{wmax}: the "
                    "HCA cannot reach its line rate", node=self.name, port=str(device),
                    score=0.6))
        return out

    def _gpus_on_bus(self, hello: Any) -> list[Finding]:
        on_bus = [a for a in (bus_address(x) for x in hello.extra.get("pci_gpus") or ())
                  if a is not None]
        if not on_bus or not hello.gpus:
            return []
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
