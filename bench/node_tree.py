"""A full node's /sys and /proc for the benchmarks: 8 HCA ports with hw_counters, a NIC,
8 NVMe disks, 4 file systems (Lustre, NFS, two local XFS), host files.

Counters move between reads (a background thread bumps them every 0.5 s), so the agent
and node_exporter both do real work, not cached reads of unchanged files.
"""

from __future__ import annotations

import shutil
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.conftest import write_proc  # noqa: E402
from tests.trees import HW, diskstats_line, ib_port, llite_stats, mountstats_nfs, nic, write  # noqa: E402

PORTS = 8
DISKS = 8


def build(root: Path) -> Path:
    write_proc(root)
    for p in range(PORTS):
        ib_port(root, f"mlx5_{p}", hw=HW, counters={"port_xmit_data": 2**40 + p})
    nic(root, "eth0", rx_bytes=10**9)
    for name in ("scratch", "home", "local0", "local1"):
        (root / name).mkdir(exist_ok=True)
    write(root / "proc/self/mounts",
          "10.0.0.1@o2ib:/scratch /scratch lustre rw 0 0\n"
          "nfs01:/export/home /home nfs4 rw 0 0\n"
          "/dev/md0 /local0 xfs rw 0 0\n/dev/md1 /local1 xfs rw 0 0\n"
          "proc /proc proc rw 0 0\nsysfs /sys sysfs rw 0 0\n")
    write(root / "sys/kernel/debug/lustre/llite/scratch-ffff9a0c4d1e8000/stats",
          llite_stats(10**12, 10**6, 10**11, 10**5, opens=500, getattrs=900))
    write(root / "proc/self/mountstats", mountstats_nfs("/home", 10**9, 10**8, 0, 0, 100, 500))
    disks(root, 0)
    return root


def disks(root: Path, tick: int) -> None:
    # Written aside and renamed into place: a reader never sees a half-written file.
    tmp = root / "proc/.diskstats.tmp"
    write(tmp, "".join(
        diskstats_line(259, d, f"nvme{d}n1", reads=1000 + tick * 10, rsect=10**6 + tick * 80,
                       writes=50 + tick, wsect=4000 + tick * 8, io_ms=tick * 3)
        for d in range(DISKS)))
    tmp.replace(root / "proc/diskstats")


class Mover:
    """Bumps the tree's counters twice a second, in place, like a busy node."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.tick = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self.tick += 1
            t = self.tick
            for p in range(PORTS):
                base = self.root / f"sys/class/infiniband/mlx5_{p}/ports/1"
                (base / "counters/port_xmit_data").write_text(f"{2**40 + t * 10**9}\n")
                (base / "counters/port_rcv_data").write_text(f"{t * 10**9}\n")
                (base / "hw_counters/np_cnp_sent").write_text(f"{t * 50}\n")
            disks(self.root, t)


def remove(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)
