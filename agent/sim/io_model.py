"""The simulated node's fabric and storage: what /sys and /proc would show.

Traffic follows the job: every step an all-reduce over the node's HCA ports (one per
GPU), a steady stream of data-loading reads from the shared Lustre file system, and
periodic checkpoints written to it. Counters are integrals of those rates over time,
in the kernel's own units and formats (octets/4, 512-byte sectors, llite stats lines).
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Callable
from dataclasses import dataclass

NDR_BYTES_S = 400e9 / 8  # 400 Gb/s per HCA port
CHECKPOINT_EVERY = 180.0  # seconds between checkpoints
FLAP_RATE = 0.02  # link drops a second on a flapping port
CHECKPOINT_SECONDS = 20.0
LUSTRE_FS = "scratch"
LUSTRE_MOUNT = "/lustre/scratch"
LUSTRE_SIZE = 20 * 10**15  # 20 PB
HOME_SIZE = 500 * 10**12
LOCAL_SIZE = 4 * 7_680_000_000_000  # 4 x 7.68 TB NVMe in RAID0


@dataclass
class IoTrouble:
    congested: bool = False  # under a badly cabled leaf: credits starve, xmit_wait climbs
    flapping_port: int | None = None  # a port whose link keeps dropping
    symbol_errors_port: int | None = None
    symbol_errors_per_s: float = 15.0  # on that port (a bad cable: hundreds a second)
    hot_ports: tuple[int, ...] = ()  # ports starved of credits on this node alone
    checkpoint_storm: bool = False  # checkpoint writes without pause, saturating Lustre
    # RoCE: this port's receiver cannot keep up: it holds its peer off with PFC pauses
    # much of the time, and the NIC's pause watchdog fires now and then.
    pfc_port: int | None = None
    # RoCE: this port drops this share of its lossless (PFC priority 3) packets for lack
    # of buffer: PFC headroom too small for the cable, pauses sent too late.
    drop_port: int | None = None
    drop_share: float = 0.005
    # A port someone disabled (ibportstate, a netdev set down): it reads Down, Disabled,
    # and the rate mlx5 gives a port that is not up (4X QDR, 40 Gb/s).
    disabled_port: int | None = None


# RoCE traffic's priority on the simulated fabric, the one with PFC on.
ROCE_PRIO = 3
UP_RATE = "400 Gb/sec (4X NDR)"
DOWN_RATE = "40 Gb/sec (4X QDR)"  # mlx5's default active width and speed


def netdev_of(port: int) -> str:
    return f"eth{port + 2}"


class SimEthtool:
    """The hardware boundary for a simulated RoCE node: ethtool statistics by netdev."""

    def __init__(self, io: SimIo) -> None:
        self.io = io

    def read(self, ifname: str) -> dict[str, int]:
        self.io.advance()
        for p in range(self.io.ports):
            if netdev_of(p) == ifname:
                return dict(self.io.pause[p])
        raise OSError(19, f"{ifname}: ENODEV: no such interface")

    def close(self) -> None:
        pass


@dataclass
class SimIo:
    """Counters of one node's ports, NICs, disks and file systems, advanced on read."""

    ports: int
    seed: int
    clock: Callable[[], float]
    step_seconds: float
    util: Callable[[], float]  # the job's current GPU utilization on this node, 0..1
    trouble_now: Callable[[], IoTrouble] = IoTrouble  # the trouble in force right now
    roce: bool = False  # Ethernet ports (RoCE) instead of InfiniBand

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed ^ 0x5EED)
        self.t0 = self.clock()
        self.last = self.t0
        self.phase = self.rng.random() * CHECKPOINT_EVERY
        n = self.ports
        self.tx_words = [self.rng.randrange(10**12) for _ in range(n)]
        self.rx_words = [self.rng.randrange(10**12) for _ in range(n)]
        self.tx_pkts = [self.rng.randrange(10**9) for _ in range(n)]
        self.rx_pkts = [self.rng.randrange(10**9) for _ in range(n)]
        self.xmit_wait = [self.rng.randrange(10**6) for _ in range(n)]
        self.symbol_errors = [0] * n
        self.link_downed = [0] * n
        self.cnp_sent = [self.rng.randrange(2**31) for _ in range(n)]
        self.cnp_handled = [self.rng.randrange(2**31) for _ in range(n)]
        self.ecn_marked = [self.rng.randrange(2**31) for _ in range(n)]
        self.port_state = [4] * n
        self.disabled = [False] * n
        # RoCE lossless counters by port, as mlx5's ethtool statistics list them with PFC
        # on priority 3: its pause counters, every priority's traffic and discards, the
        # port's own packet and discard counters (the same drops again), the watchdog.
        prio = f"prio{ROCE_PRIO}"
        self.pause = [{f"tx_{prio}_pause": 0, f"tx_{prio}_pause_duration": 0,
                       f"rx_{prio}_pause": 0, f"rx_{prio}_pause_duration": 0,
                       **{f"rx_prio{i}_{what}": 0 for i in range(8)
                          for what in ("packets", "discards")},
                       "rx_packets_phy": 0, "rx_discards_phy": 0,
                       "tx_pause_storm_warning_events": 0,
                       "tx_pause_storm_error_events": 0}
                      for _ in range(n)]
        self.lustre = {"read_bytes": 0, "reads": 0, "write_bytes": 0, "writes": 0,
                       "open": 0, "getattr": 0, "setattr": 0}
        self.nfs = {"read": 0, "write": 0, "read_ops": 0, "read_ms": 0}
        self.disk_sectors_read = [0] * 4
        self.disk_sectors_written = [0] * 4
        self.disk_ios = [0] * 4
        self.disk_ms = [0] * 4
        self.eth_rx = self.rng.randrange(10**10)
        self.eth_tx = self.rng.randrange(10**10)
        self.lustre_used = int(LUSTRE_SIZE * 0.61)

    # -- the model ------------------------------------------------------------------------

    def checkpointing(self, t: float | None = None) -> bool:
        t = self.clock() if t is None else t
        return (t - self.t0 + self.phase) % CHECKPOINT_EVERY < CHECKPOINT_SECONDS

    def advance(self) -> None:
        now = self.clock()
        dt = now - self.last
        if dt < 0.05:
            return
        self.last = now
        util = self.util()
        trouble = self.trouble_now()
        ckpt = self.checkpointing(now) or trouble.checkpoint_storm
        # All-reduce over every port: about 60 % of line rate while the job computes.
        congestion = 0.72 if trouble.congested else 1.0
        for p in range(self.ports):
            if trouble.disabled_port == p:
                self.disabled[p] = True
            if self.disabled[p]:
                continue
            if trouble.flapping_port == p and self.rng.random() < FLAP_RATE * dt:
                self.link_downed[p] += 1
                self.port_state[p] = 1 if self.port_state[p] == 4 else 4
            elif trouble.flapping_port != p and self.port_state[p] != 4:
                self.port_state[p] = 4
            if self.port_state[p] != 4:
                continue
            rate = NDR_BYTES_S * 0.6 * util * congestion * (0.95 + 0.1 * self.rng.random())
            if ckpt:
                rate *= 0.8  # checkpoint traffic shares the fabric
            words = int(rate * dt / 4)
            self.tx_words[p] += words
            self.rx_words[p] += int(words * (0.98 + 0.04 * self.rng.random()))
            pkts = int(rate * dt / 4096)
            self.tx_pkts[p] += pkts
            self.rx_pkts[p] += pkts
            wait = 5e7 if p in trouble.hot_ports else 2e5 if trouble.congested else 2e3
            self.xmit_wait[p] += int(wait * dt * (0.5 + self.rng.random()))
            cnps = 5e4 if trouble.congested else 50
            self.cnp_sent[p] = (self.cnp_sent[p] + int(cnps * dt)) % 2**32
            self.cnp_handled[p] = (self.cnp_handled[p] + int(cnps * dt * 0.97)) % 2**32
            self.ecn_marked[p] = (self.ecn_marked[p] + int(cnps * dt * 1.1)) % 2**32
            if self.roce:
                self._pfc(p, dt, trouble, pkts)
            if trouble.symbol_errors_port == p:
                # A 16-bit counter: it saturates at 65535, as the real one does.
                self.symbol_errors[p] = min(65535, self.symbol_errors[p] + int(
                    trouble.symbol_errors_per_s * dt * 2 * self.rng.random()))
        # Data loading: ~1.5 GB/s per node of reads; checkpoints: 4 GB/s of writes.
        read_rate = 1.5e9 * util * (0.8 + 0.4 * self.rng.random())
        self.lustre["read_bytes"] += int(read_rate * dt)
        self.lustre["reads"] += int(read_rate * dt / 4 / 2**20)
        self.lustre["open"] += int(40 * dt)
        self.lustre["getattr"] += int(200 * dt)
        if ckpt:
            per_node = 15e9 if trouble.checkpoint_storm else 4e9
            write_rate = per_node * (0.9 + 0.2 * self.rng.random())
            self.lustre["write_bytes"] += int(write_rate * dt)
            self.lustre["writes"] += int(write_rate * dt / 16 / 2**20)
            self.lustre["setattr"] += int(20 * dt)
        self.nfs["read"] += int(2e6 * dt)
        self.nfs["read_ops"] += int(30 * dt)
        self.nfs["read_ms"] += int(30 * dt * (2 + self.rng.random()))
        # Local NVMe cache: dataset shards read back, a little written.
        for d in range(4):
            reads = int(2e3 * util * dt)
            self.disk_sectors_read[d] += reads * 256
            self.disk_sectors_written[d] += int(50 * dt) * 256
            self.disk_ios[d] += reads + int(50 * dt)
            self.disk_ms[d] += int((reads + 50 * dt) * 0.08)
        self.eth_rx += int(2e6 * dt)
        self.eth_tx += int(1e6 * dt)

    def _pfc(self, p: int, dt: float, trouble: IoTrouble, pkts: int) -> None:
        """PFC on priority 3 (the RoCE traffic class): a healthy port pauses for moments
        and drops nothing; the troubled one holds its peer off about 40 % of the time, or
        drops a share of what arrives (counted by priority and by the port, as mlx5
        does: the same drops twice)."""
        c = self.pause[p]
        prio = f"prio{ROCE_PRIO}"
        share = 0.4 * (0.9 + 0.2 * self.rng.random()) if trouble.pfc_port == p else 0.0005
        c[f"tx_{prio}_pause_duration"] += int(share * dt * 1e6)
        c[f"tx_{prio}_pause"] += int(share * dt * 1e6 / 50)  # a pause quantum about 50 us
        c[f"rx_{prio}_pause_duration"] += int(0.0005 * dt * 1e6)
        c[f"rx_{prio}_pause"] += int(0.0005 * dt * 1e6 / 50)
        if trouble.pfc_port == p and self.rng.random() < dt / 30:
            c["tx_pause_storm_warning_events"] += 1
        dropped = int(pkts * trouble.drop_share) if trouble.drop_port == p else 0
        c[f"rx_{prio}_packets"] += pkts - dropped
        c[f"rx_{prio}_discards"] += dropped
        c["rx_packets_phy"] += pkts
        c["rx_discards_phy"] += dropped

    def ethtool(self) -> SimEthtool:
        """The RoCE netdevs' driver statistics, as the ioctl would read them."""
        return SimEthtool(self)

    # -- files -------------------------------------------------------------------------------

    def files(self) -> dict[str, Callable[[], str]]:
        out: dict[str, Callable[[], str]] = {}
        for p in range(self.ports):
            self._port_files(out, p)
        eth = "sys/class/net/eth0"
        out[f"{eth}/device/vendor"] = _const("0x15b3\n")
        out[f"{eth}/speed"] = _const("25000\n")
        out[f"{eth}/operstate"] = _const("up\n")
        stats: dict[str, Callable[[], int]] = {
            "rx_bytes": lambda: self.eth_rx, "tx_bytes": lambda: self.eth_tx,
            "rx_packets": lambda: self.eth_rx // 1500,
            "tx_packets": lambda: self.eth_tx // 1500}
        for name in ("rx_errors", "tx_errors", "rx_dropped", "tx_dropped"):
            stats[name] = lambda: 0
        for name, fn in stats.items():
            out[f"{eth}/statistics/{name}"] = self._reader(fn)
        out["proc/self/mounts"] = _const(
            f"10.0.0.1@o2ib:/{LUSTRE_FS} {LUSTRE_MOUNT} lustre rw,flock,lazystatfs 0 0\n"
            "nfs01:/export/home /home nfs4 rw,vers=4.2 0 0\n"
            "/dev/md0 /local xfs rw,noatime 0 0\n"
            "proc /proc proc rw 0 0\nsysfs /sys sysfs rw 0 0\ntmpfs /run tmpfs rw 0 0\n")
        out[f"sys/kernel/debug/lustre/llite/{LUSTRE_FS}-ffff9a0c4d1e8000/stats"] = self._reader(
            self._llite, raw=True)
        out["proc/self/mountstats"] = self._reader(self._mountstats, raw=True)
        out["proc/diskstats"] = self._reader(self._diskstats, raw=True)
        for d in range(4):
            out[f"sys/block/nvme{d}n1/size"] = _const("15002931888\n")
        out["sys/devices/virtual/block/md0/size"] = _const("60011727552\n")
        return out

    def _port_files(self, out: dict[str, Callable[[], str]], p: int) -> None:
        """HCA port p's files, added to out (a method, so each closure holds its own p)."""
        dev = f"sys/class/infiniband/mlx5_{p}"
        base = f"{dev}/ports/1"
        out[f"{dev}/hca_type"] = _const("MT4129\n")
        out[f"{dev}/board_id"] = _const("MT_0000000838\n")
        out[f"{dev}/fw_ver"] = _const("28.39.1002\n")
        # The HCA's PCIe link, as sysfs writes it (kernel pci_speed_string): Gen5 x16.
        for name, value in (("current_link_speed", "32.0 GT/s PCIe"),
                            ("max_link_speed", "32.0 GT/s PCIe"),
                            ("current_link_width", "16"), ("max_link_width", "16")):
            out[f"{dev}/device/{name}"] = _const(value + "\n")
        out[f"{base}/rate"] = self._reader(
            lambda: DOWN_RATE if self.disabled[p] else UP_RATE)
        out[f"{base}/link_layer"] = _const("Ethernet\n" if self.roce else "InfiniBand\n")
        if self.roce:  # the port's netdev, as /sys/class/infiniband/<dev>/device/net lists it
            out[f"{dev}/device/net/{netdev_of(p)}/ifindex"] = _const(f"{p + 3}\n")
            # IFF_UP (0x1) cleared when someone set it down; 0x1003 up, broadcast, multicast.
            out[f"sys/class/net/{netdev_of(p)}/flags"] = self._reader(
                lambda: "0x1002" if self.disabled[p] else "0x1003")
        out[f"{base}/state"] = self._reader(
            lambda: "4: ACTIVE" if self.port_state[p] == 4 and not self.disabled[p]
            else "1: DOWN")
        out[f"{base}/phys_state"] = self._reader(
            lambda: "3: Disabled" if self.disabled[p] else
            "5: LinkUp" if self.port_state[p] == 4 else "2: Polling")
        counters: dict[str, Callable[[], int]] = {
            "port_xmit_data": lambda: self.tx_words[p],
            "port_rcv_data": lambda: self.rx_words[p],
            "port_xmit_packets": lambda: self.tx_pkts[p],
            "port_rcv_packets": lambda: self.rx_pkts[p],
            "port_xmit_wait": lambda: self.xmit_wait[p],
            "symbol_error": lambda: self.symbol_errors[p],
            "link_downed": lambda: min(255, self.link_downed[p]),
        }
        for name in ("port_rcv_errors", "port_rcv_remote_physical_errors",
                     "port_xmit_discards", "link_error_recovery",
                     "excessive_buffer_overrun_errors", "local_link_integrity_errors"):
            counters[name] = lambda: 0
        for name, fn in counters.items():
            out[f"{base}/counters/{name}"] = self._reader(fn)
        hw: dict[str, Callable[[], int]] = {
            "np_cnp_sent": lambda: self.cnp_sent[p],
            "rp_cnp_handled": lambda: self.cnp_handled[p],
            "np_ecn_marked_roce_packets": lambda: self.ecn_marked[p],
            "out_of_sequence": lambda: 0, "local_ack_timeout_err": lambda: 0}
        for name, fn in hw.items():
            out[f"{base}/hw_counters/{name}"] = self._reader(fn)

    def _reader(self, fn: Callable[[], object], raw: bool = False) -> Callable[[], str]:
        def read() -> str:
            self.advance()
            value = fn()
            return value if raw else f"{value}\n"  # type: ignore[return-value]
        return read

    def _llite(self) -> str:
        lu = self.lustre
        return (
            "snapshot_time             1790277040.611962111 secs.nsecs\n"
            f"read_bytes                {lu['reads']} samples [bytes] 4096 4194304 "
            f"{lu['read_bytes']} 0\n"
            f"write_bytes               {lu['writes']} samples [bytes] 4096 16777216 "
            f"{lu['write_bytes']} 0\n"
            f"open                      {lu['open']} samples [usecs] 0 36643 1 1\n"
            f"close                     {lu['open']} samples [usecs] 0 27750 1 1\n"
            f"getattr                   {lu['getattr']} samples [usecs] 1 59652 1 1\n"
            f"setattr                   {lu['setattr']} samples [usecs] 102 447829 1 1\n")

    def _mountstats(self) -> str:
        n = self.nfs
        return (
            "device proc mounted on /proc with fstype proc\n"
            "device nfs01:/export/home mounted on /home with fstype nfs4 statvers=1.1\n"
            "\topts:\trw,vers=4.2\n"
            f"\tbytes:\t{n['read']} {n['write']} 0 0 {n['read']} {n['write']} 0 0\n"
            "\tper-op statistics\n"
            f"\t        READ: {n['read_ops']} {n['read_ops']} 0 0 0 0 {n['read_ms']} "
            f"{n['read_ms']} 0\n"
            "\t       WRITE: 0 0 0 0 0 0 0 0 0\n")

    def _diskstats(self) -> str:
        lines = []
        for d in range(4):
            ios, ms = self.disk_ios[d], self.disk_ms[d]
            lines.append(f" 259 {d * 2:7d} nvme{d}n1 {ios} 0 {self.disk_sectors_read[d]} {ms} "
                         f"{ios // 20} 0 {self.disk_sectors_written[d]} {ms // 20} 0 "
                         f"{int(ms * 0.9)} {ms} 0 0 0 0\n")
        total_r = sum(self.disk_sectors_read)
        total_w = sum(self.disk_sectors_written)
        ios = sum(self.disk_ios)
        lines.append(f"   9       0 md0 {ios} 0 {total_r} {sum(self.disk_ms)} {ios // 20} 0 "
                     f"{total_w} 0 0 {max(self.disk_ms)} 0 0 0 0 0\n")
        return "".join(lines)

    def statvfs(self, path: str) -> os.statvfs_result:
        """Capacity as statvfs would answer for the simulated mounts."""
        if path.rstrip("/").endswith(LUSTRE_MOUNT):
            size, used = LUSTRE_SIZE, self.lustre_used + self.lustre["write_bytes"]
        elif path.rstrip("/").endswith("/home"):
            size, used = HOME_SIZE, int(HOME_SIZE * 0.42)
        elif path.rstrip("/").endswith("/local"):
            size, used = LOCAL_SIZE, int(LOCAL_SIZE * (0.3 + 0.05 * math.sin(self.seed)))
        else:
            raise FileNotFoundError(2, "No such file or directory", path)
        frsize = 4096
        blocks, free = size // frsize, (size - used) // frsize
        files = size // 2**20
        return os.statvfs_result((frsize, frsize, blocks, free, free, files,
                                  int(files * 0.7), int(files * 0.7), 0, 255))


def _const(text: str) -> Callable[[], str]:
    return lambda: text
