"""A full node's /sys and /proc for the benchmarks: 8 HCA ports with hw_counters, a NIC,
8 NVMe disks, 4 file systems (Lustre, NFS, two local XFS), host files, and the training
processes on the 8 GPUs (pids 100-107). The tree is the host as a container agent sees
it under its root prefix: the mount table is PID 1's.

Counters move between reads (a background thread bumps them every 0.5 s), so the agent
and node_exporter both do real work, not cached reads of unchanged files.
"""

from __future__ import annotations

import os
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
GPUS = 8  # the bench's fake GPUs run pids 100 to 107


def build(root: Path) -> Path:
    write_proc(root)
    for p in range(PORTS):
        ib_port(root, f"mlx5_{p}", hw=HW, counters={"port_xmit_data": 2**40 + p})
    nic(root, "eth0", rx_bytes=10**9)
    for name in ("scratch", "home", "local0", "local1"):
        (root / name).mkdir(exist_ok=True)
    write(root / "proc/1/mounts",
          "10.0.0.1@o2ib:/scratch /scratch lustre rw 0 0\n"
          "nfs01:/export/home /home nfs4 rw 0 0\n"
          "/dev/md0 /local0 xfs rw 0 0\n/dev/md1 /local1 xfs rw 0 0\n"
          "proc /proc proc rw 0 0\nsysfs /sys sysfs rw 0 0\n")
    write(root / "sys/kernel/debug/lustre/llite/scratch-ffff9a0c4d1e8000/stats",
          llite_stats(10**12, 10**6, 10**11, 10**5, opens=500, getattrs=900))
    write(root / "proc/1/mountstats", mountstats_nfs("/home", 10**9, 10**8, 0, 0, 100, 500))
    for gpu in range(GPUS):
        pid = 100 + gpu
        write(root / f"proc/{pid}/stat",
              f"{pid} (python) S 1 {pid} {pid} 0 -1 4194560 1 0 0 0 500 50 0 0 20 0 40 0 "
              f"{1000 + gpu} 100000000 2000 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 "
              f"{gpu} 0 0 0 0 0\n")
        write(root / f"proc/{pid}/status", "Name:\tpython\nUid:\t1000\t1000\t1000\t1000\n")
        write(root / f"proc/{pid}/cmdline", f"python\0train.py\0--rank\0{gpu}\0")
        write(root / f"proc/{pid}/cgroup", "0::/system.slice/slurmstepd.scope/job_4242/step_0\n")
    write(root / "etc/passwd",
          "root:x:0:0::/root:/bin/sh\nalice:x:1000:1000::/home/alice:/bin/sh\n")
    disks(root, 0)
    return root


def disks(root: Path, tick: int) -> None:
    # Overwritten in place, as the kernel's file is the same file read after read (a
    # reader keeps it open), and never truncated: its counters only grow, so does its
    # text, and a reader never sees it empty.
    text = "".join(
        diskstats_line(259, d, f"nvme{d}n1", reads=1000 + tick * 10, rsect=10**6 + tick * 80,
                       writes=50 + tick, wsect=4000 + tick * 8, io_ms=tick * 3)
        for d in range(DISKS)).encode()
    fd = os.open(root / "proc/diskstats", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, text, 0)
    finally:
        os.close(fd)


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
