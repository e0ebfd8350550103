"""A data-parallel training job on 8-GPU H100/H200 nodes, as NVML and /proc would see it.

Deterministic for a seed: each node has its own random stream, and values depend on
the simulated time, so two runs with one seed look alike. A few nodes are given
trouble on purpose so the views have something to show: a thermally throttled GPU,
a power-capped node, a slow node (straggler) and, now and then, an XID.
"""

from __future__ import annotations

import functools
import math
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from agent.sim.fake_nvml import FakeGpu, FakeNvml
from agent.sim.io_model import IoTrouble, SimIo
from agent.sim.pci_tree import GEN5_X16, pci_tree
from tuimon_core.protocol.fields import NVML_PCIE_KB

# A current production driver: it answers NVML's PCIe byte counters (from R555).
DRIVER = "570.172.08"
GPU_MODELS = (
    ("NVIDIA H100 80GB HBM3", 80 * 1024**3, 700_000, 1980, 2619),
    ("NVIDIA H200", 141 * 1024**3, 700_000, 1980, 3201),
)
STEP_SECONDS = 1.6


@dataclass
class NodeTrouble:
    """What is wrong with one simulated node, if anything."""

    hot_gpu: int | None = None  # thermal slowdown on this GPU
    power_capped: bool = False
    slow: float = 1.0  # compute takes this many times longer (straggler)
    xid_every: float | None = None  # seconds between XIDs on GPU 0
    io: IoTrouble = field(default_factory=IoTrouble)
    slow_gpu: int | None = None  # only this GPU's rank computes `slow` times longer
    lost_gpu: int | None = None  # this GPU falls off the bus (XID 79)
    # Gray failures: this GPU's PCIe link trains at Gen3 x8 while busy; the switch above
    # this GPU has its link to the root port at Gen4; this GPU has six NVLinks down and
    # retrains the rest now and then; this GPU leaves NVML (but stays on the PCI bus);
    # this node runs another driver.
    pcie_gpu: int | None = None
    switch_gpu: int | None = None
    nvlink_gpu: int | None = None
    missing_gpu: int | None = None
    driver: str | None = None
    # The node's power brake asserted: every GPU's clock collapses (hardware slowdown);
    # this GPU loses one NVLink (of its bridge, on a node of few GPUs); NVML cannot be
    # loaded when the agent starts again (a driver upgrade that left no libnvidia-ml).
    power_brake: bool = False
    nvlink_lost_gpu: int | None = None
    nvml_missing: bool = False
    since: float = float("-inf")  # simulated monotonic time the trouble starts


_NO_TROUBLE = NodeTrouble()


def _text(value: str) -> Callable[[], str]:
    line = value + "\n"
    return lambda: line
# Who the simulated job runs as, and its Slurm job id, for the per-GPU process view.
SIM_UID = 4021
SIM_PASSWD = "root:x:0:0:root:/root:/bin/bash\nana:x:4021:4021::/home/ana:/bin/bash\n"
SIM_SLURM_JOB = 812345


@dataclass
class SimNodeModel:
    """Moves one node's fake GPUs and host counters forward in time."""

    name: str
    gpus: int
    seed: int
    trouble: NodeTrouble = field(default_factory=NodeTrouble)
    clock: Callable[[], float] = time.monotonic
    roce: bool = False  # the fabric is RoCE (Ethernet ports) instead of InfiniBand

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        model = GPU_MODELS[self.seed % 7 == 0]
        self.nvml = _SimNvml(self, [
            FakeGpu(i, name=model[0], mem_total=model[1], power_limit_mw=model[2],
                    max_sm_mhz=model[3], max_mem_mhz=model[4], sm_mhz=model[3],
                    mem_mhz=model[4],
                    uuid=f"GPU-{uuid.UUID(int=self.rng.getrandbits(128), version=4)}")
            for i in range(self.gpus)
        ], driver_version=self.trouble.driver or DRIVER)
        self.bus_gpus = list(self.nvml.gpus)  # what the PCI bus has, whatever NVML says
        self.t0 = self.clock()
        self.last = self.t0
        self.phase = self.rng.random() * STEP_SECONDS
        self.boot_id = str(uuid.UUID(int=self.rng.getrandbits(128), version=4))
        self.cpu_busy = 0
        self.cpu_total = 0
        self.cpus = 128
        self.uptime0 = 86400.0 * (3 + self.rng.random() * 20)
        self.next_xid = (self.t0 + self.trouble.xid_every) if self.trouble.xid_every else None
        self._pids = [40000 + self.rng.randrange(20000) + i for i in range(self.gpus)]
        # One HCA port per GPU (rail-optimised), traffic following the GPUs' activity.
        self.io = SimIo(ports=self.gpus, seed=self.seed, clock=self.clock,
                        step_seconds=STEP_SECONDS, util=self._mean_util,
                        trouble_now=lambda: self.active().io, roce=self.roce)
        self._lost_done = False

    def active(self) -> NodeTrouble:
        """The node's trouble once its onset has passed; none before."""
        return self.trouble if self.clock() >= self.trouble.since else _NO_TROUBLE

    def rank_slowdown(self, gpu: int) -> float:
        tr = self.active()
        if tr.slow_gpu is not None:
            return tr.slow if tr.slow_gpu == gpu else 1.0
        return tr.slow

    def _mean_util(self) -> float:
        gpus = self.nvml.gpus
        return sum(g.util_gpu for g in gpus) / 100 / len(gpus) if gpus else 0.5

    # -- GPUs -----------------------------------------------------------------------

    def update_gpu(self, g: FakeGpu) -> None:
        now = self.clock()
        dt = max(0.0, now - getattr(g, "_t", now))
        g._t = now  # type: ignore[attr-defined]
        elapsed = now - self.t0
        tr = self.active()
        if tr.missing_gpu is not None and any(x.index == tr.missing_gpu
                                              for x in self.nvml.gpus):
            # Gone from NVML (the driver dropped it), still on the PCI bus.
            self.nvml.gpus = [x for x in self.nvml.gpus if x.index != tr.missing_gpu]
        if tr.lost_gpu == g.index and not self._lost_done:
            self._lost_done = True
            g.lost = True  # every NVML call on it fails from now on
            self.nvml.inject_xid(g.index, 79)
            return
        # Within a step, compute then all-reduce; at 1 s sampling the utilization
        # NVML reports is an average with visible jitter.
        wave = 0.5 + 0.5 * math.sin(2 * math.pi * (elapsed + self.phase) / STEP_SECONDS)
        slow = self.rank_slowdown(g.index)
        base = 0.93 / slow if slow > 1 else 0.93
        util = min(1.0, max(0.0, base - 0.08 * wave + self.rng.gauss(0, 0.02)))
        hot = tr.hot_gpu == g.index
        g.util_gpu = round(util * 100)
        g.util_mem = round(min(100, util * 62 + self.rng.gauss(0, 3)))
        g.mem_used = int(g.mem_total * (0.86 + 0.01 * math.sin(elapsed / 30 + g.index)))
        limit = g.power_limit_mw * (0.78 if tr.power_capped else 1.0)
        power = 90_000 + util * (g.power_limit_mw - 90_000) * (0.92 + 0.06 * self.rng.random())
        g.power_mw = int(min(limit * (0.985 + 0.015 * self.rng.random()), power))
        g.energy_mj += int(g.power_mw * dt)
        target_temp = 42 + 30 * util + (22 if hot else 0) + g.index * 0.5
        g.temp = round(target_temp + self.rng.gauss(0, 0.6))
        reasons = 0
        sm = g.max_sm_mhz
        if hot and g.temp >= 85:
            reasons |= 0x20 | 0x40  # software and hardware thermal slowdown
            sm = int(g.max_sm_mhz * 0.72)
        if tr.power_capped and g.power_mw >= limit * 0.98:
            reasons |= 0x4
            sm = min(sm, int(g.max_sm_mhz * 0.86))
        if tr.power_brake:  # HW Slowdown and HW Power Brake: 86 of 1980 MHz, as seen
            reasons |= 0x8 | 0x80
            sm = min(sm, int(g.max_sm_mhz * 0.045) + 15)
        if util < 0.05:
            reasons |= 0x1
        g.clock_events = reasons
        g.sm_mhz = sm - self.rng.randrange(0, 15)
        g.pstate = 0
        # An idle GPU drops its PCIe link to Gen1 to save power; a busy one runs at its
        # most, unless this is the GPU whose link trained at Gen3 x8.
        if tr.pcie_gpu == g.index:
            g.pcie_gen, g.pcie_width = 3, 8
        else:
            g.pcie_gen = 1 if util < 0.05 else g.pcie_gen_max
            g.pcie_width = g.pcie_width_max
        g.pcie_replays += 1 if self.rng.random() < 0.02 * dt else 0  # a healthy link's few
        if tr.nvlink_gpu == g.index and g.nvlinks is not None:
            g.nvlinks = [1] * 12 + [0] * 6
            g.nvlink_recovery += 1 if self.rng.random() < dt / 20 else 0
        if tr.nvlink_lost_gpu == g.index and g.nvlinks:
            g.nvlinks[3] = 0
        g.pcie_tx_kbs = int(1_500_000 * util + self.rng.random() * 200_000)
        g.pcie_rx_kbs = int(9_000_000 * (1 - wave) * util + self.rng.random() * 500_000)
        g.pcie_tx_bytes += int(g.pcie_tx_kbs * NVML_PCIE_KB * dt)
        g.pcie_rx_bytes += int(g.pcie_rx_kbs * NVML_PCIE_KB * dt)
        # NVLink all-reduce traffic, ~300 GB/s per direction at full tilt.
        if g.nvlink_tx_kib is not None:
            g.nvlink_tx_kib += int(300e9 / 1024 * util * dt * (0.9 + 0.2 * wave))
            g.nvlink_rx_kib = (g.nvlink_rx_kib or 0) + int(300e9 / 1024 * util * dt *
                                                           (0.9 + 0.2 * wave))
        g.procs = [(self._pids[g.index], int(g.mem_used * 0.97))] if util > 0.05 else []
        if g.index == 0 and self.next_xid is not None and now >= self.next_xid \
                and tr.xid_every is not None:
            self.next_xid = now + (self.trouble.xid_every or 3600)
            self.nvml.inject_xid(0, self.rng.choice((13, 31, 43, 63, 94)))

    # -- host files -----------------------------------------------------------------

    def files(self) -> dict[str, Callable[[], str]]:
        return {
            **self.io.files(),
            **self._platform_files(),
            "proc/stat": self._stat,
            "proc/loadavg": self._loadavg,
            "proc/meminfo": self._meminfo,
            "proc/uptime": self._uptime,
            "proc/sys/kernel/random/boot_id": lambda: self.boot_id + "\n",
            "etc/passwd": lambda: SIM_PASSWD,
            **{f"proc/{pid}/{name}": functools.partial(self._proc_file, pid, rank, name)
               for rank, pid in enumerate(self._pids)
               for name in ("stat", "status", "cmdline", "cgroup")},
        }

    def _platform_files(self) -> dict[str, Callable[[], str]]:
        """The PCI bus (the GPUs, four NVSwitches, the HCAs, the switches and root ports
        above them), the kernel release and the loaded modules, as sysfs and /proc show
        them on an HGX node."""
        out: dict[str, Callable[[], str]] = {}

        def device(address: str, vendor: str, cls: str, driver: str) -> None:
            base = f"sys/bus/pci/devices/{address}"
            out[f"{base}/vendor"] = _text(vendor)
            out[f"{base}/class"] = _text(cls)
            out[f"{base}/driver"] = _text(driver)  # a generated symlink: its target's name
        for g in self.bus_gpus:
            device(f"0000:{0x18 + 0x10 * g.index:02x}:00.0", "0x10de", "0x030200", "nvidia")
        for i in range(4):
            device(f"0000:{0x05 + i:02x}:00.0", "0x10de", "0x068000", "nvidia")  # NVSwitch
        for p in range(self.gpus):
            device(f"0000:{0x1a + 0x10 * p:02x}:00.0", "0x15b3", "0x020700", "mlx5_core")
        out.update(pci_tree(self.bus_gpus, self.gpus, self._uplink))
        out["proc/sys/kernel/osrelease"] = _text("5.15.0-119-generic")
        out["proc/modules"] = _text(
            "nvidia_peermem 16384 0 - Live 0x0000000000000000 (OE)\n"
            "nvidia_uvm 1536000 4 - Live 0x0000000000000000 (OE)\n"
            "nvidia 56823808 300 nvidia_peermem,nvidia_uvm, Live 0x0000000000000000 (OE)\n"
            "mlx5_ib 450560 0 - Live 0x0000000000000000\n")
        return out

    def _uplink(self, gpu: int) -> tuple[int, int]:
        """The link from the switch above this GPU to its root port now."""
        return (4, 16) if self.active().switch_gpu == gpu else GEN5_X16

    def _proc_file(self, pid: int, rank: int, name: str) -> str:
        """One rank's process as the kernel shows it: a Slurm job's task under cgroup v2."""
        if name == "stat":
            return (f"{pid} (python3) S 1 {pid} {pid} 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 "
                    f"12 0 {int(self.uptime0 * 100)} 0 0\n")
        if name == "status":
            return f"Name:\tpython3\nUid:\t{SIM_UID}\t{SIM_UID}\t{SIM_UID}\t{SIM_UID}\n"
        if name == "cmdline":
            return "\0".join(["python3", "-u", "pretrain.py", "--config",
                              "configs/70b.yaml", f"--local-rank={rank}"]) + "\0"
        return (f"0::/system.slice/slurmstepd.scope/job_{SIM_SLURM_JOB}/step_0/user/"
                f"task_{rank}\n")

    def _stat(self) -> str:
        now = self.clock()
        dt = max(0.0, now - self.last)
        self.last = now
        ticks = int(dt * 100 * self.cpus)
        busy = int(ticks * (0.18 + 0.05 * self.rng.random()))
        self.cpu_busy += busy
        self.cpu_total += ticks
        idle = self.cpu_total - self.cpu_busy
        user = int(self.cpu_busy * 0.8)
        system = self.cpu_busy - user
        lines = [f"cpu  {user} 0 {system} {idle} 0 0 0 0 0 0"]
        lines += [f"cpu{i} 0 0 0 0 0 0 0 0 0 0" for i in range(self.cpus)]
        return "\n".join(lines) + "\n"

    def _loadavg(self) -> str:
        load = 22 + 3 * math.sin((self.clock() - self.t0) / 60)
        return f"{load:.2f} {load * 0.98:.2f} {load * 0.95:.2f} 24/2100 {self.seed + 4000}\n"

    def _meminfo(self) -> str:
        total_kb = 2 * 1024**3  # 2 TiB in kB
        avail_kb = int(total_kb * (0.55 + 0.02 * math.sin((self.clock() - self.t0) / 90)))
        return (f"MemTotal:       {total_kb} kB\nMemFree:        {avail_kb // 2} kB\n"
                f"MemAvailable:   {avail_kb} kB\n")

    def _uptime(self) -> str:
        up = self.uptime0 + self.clock() - self.t0
        return f"{up:.2f} {up * 100:.2f}\n"


class _SimNvml(FakeNvml):
    def __init__(self, model: SimNodeModel, gpus: list[FakeGpu], *,
                 driver_version: str = DRIVER) -> None:
        super().__init__(gpus, driver_version=driver_version)
        self._model = model

    def refresh(self, gpu: FakeGpu) -> None:
        # Move a GPU on at most once per read burst (many calls per sample).
        now = self._model.clock()
        if now - getattr(gpu, "_refreshed", -1.0) > 0.2:
            gpu._refreshed = now  # type: ignore[attr-defined]
            self._model.update_gpu(gpu)


def troubles_for(nodes: int, seed: int, nodes_per_leaf: int = 8) -> dict[int, NodeTrouble]:
    """Which nodes get which trouble, the same for a seed."""
    rng = random.Random(seed * 7919 + nodes)
    picks = list(range(nodes))
    rng.shuffle(picks)
    out: dict[int, NodeTrouble] = {}
    if nodes >= 2:
        out[picks[0]] = NodeTrouble(hot_gpu=rng.randrange(8))
    if nodes >= 4:
        out[picks[1]] = NodeTrouble(power_capped=True)
        out[picks[2]] = NodeTrouble(slow=1.18)
    if nodes >= 8:
        out[picks[3]] = NodeTrouble(xid_every=300.0)
        out[picks[4]] = NodeTrouble(io=IoTrouble(flapping_port=rng.randrange(8)))
        out[picks[5]] = NodeTrouble(io=IoTrouble(symbol_errors_port=rng.randrange(8)))
    if nodes >= 2 * nodes_per_leaf:
        # A badly cabled uplink: every node under one leaf is starved of credits.
        leaf = rng.randrange(nodes // nodes_per_leaf)
        for i in range(leaf * nodes_per_leaf, min(nodes, (leaf + 1) * nodes_per_leaf)):
            trouble = out.setdefault(i, NodeTrouble())
            trouble.io.congested = True
    return out
