"""Storage collector: Lustre, GPFS and NFS clients, local block devices, and the
capacity of the file systems that matter.

A cluster is sized by aggregate throughput, so every file system reports bytes/s and
operations/s; capacity and inodes come from statvfs, which can hang on a dead network
file system: it runs in threads of its own with a timeout, and a mount that does not
answer is reported as such instead of stalling the sampler.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from agent.collectors.storage_parsers import (
    FormatError,
    Mount,
    disk_kind_from_name,
    lustre_fsname,
    lustre_source_fsname,
    parse_diskstats,
    parse_llite_stats,
    parse_mmpmon_fs_io_s,
    parse_mounts,
    parse_mountstats,
)
from agent.files import FileTree, ReadError
from agent.rates import CounterSet, RateTracker
from tuimon_core.filesystems import DATA_FSTYPES
from tuimon_core.protocol.text import clean

LLITE_DIRS = ("proc/fs/lustre/llite", "sys/kernel/debug/lustre/llite")  # before / from 2.12
# Lustre client instances are listed again this many samples apart (and when the Lustre
# mounts change or a read fails): listing them each second would find the same ones.
LIST_EVERY = 10
DEFAULT_MMPMON = "/usr/lpp/mmfs/bin/mmpmon"
SECTOR = 512
_IDLE_SKIP = re.compile(r"^(loop|ram|zram|sr|fd)\d")


@dataclass
class StorageConfig:
    mmpmon: str | None = DEFAULT_MMPMON
    gpfs_period: float = 5.0
    gpfs_timeout: float = 5.0
    capacity_period: float = 30.0
    statvfs_timeout: float = 2.0
    # The simulator's answers never block: it asks them inline instead of in threads.
    statvfs: Callable[[str], os.statvfs_result] | None = None
    statvfs_inline: bool = False


class _CapacityProbe:
    """statvfs off the sampling thread, with a timeout, never two at once per mount."""

    def __init__(self, root: str, timeout: float,
                 statvfs: Callable[[str], os.statvfs_result] = os.statvfs) -> None:
        self.root = root
        self.timeout = timeout
        self.statvfs = statvfs
        self.inline = False
        self._pool = ThreadPoolExecutor(2, thread_name_prefix="tuimon-statvfs")
        self._pending: dict[str, tuple[Future[os.statvfs_result], float]] = {}

    def probe(self, mountpoint: str) -> tuple[dict[str, int] | None, str | None]:
        pending = self._pending.get(mountpoint)
        if pending is not None:
            fut, started = pending
            if not fut.done():
                return None, f"statvfs has not returned for {time.monotonic() - started:.0f} s"
            del self._pending[mountpoint]
        path = os.path.join(self.root, mountpoint.lstrip("/"))
        try:
            if self.inline:
                st = self.statvfs(path)
            else:
                fut = self._pool.submit(self.statvfs, path)
                st = fut.result(timeout=self.timeout)
        except TimeoutError:
            self._pending[mountpoint] = (fut, time.monotonic())
            return None, f"statvfs timed out after {self.timeout:g} s"
        except OSError as exc:
            return None, f"statvfs: {exc.strerror or exc}"
        return {
            "size": st.f_blocks * st.f_frsize,
            "free": st.f_bfree * st.f_frsize,
            "avail": st.f_bavail * st.f_frsize,
            "inodes": st.f_files,
            "inodes_free": st.f_ffree,
        }, None

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class StorageCollector:
    def __init__(self, files: FileTree, config: StorageConfig | None = None) -> None:
        self.files = files
        self.config = config or StorageConfig()
        self._rates = RateTracker()
        self._disk_rates = CounterSet()
        # The host's mount namespace: our own, or PID 1's when the host is mounted under
        # a root prefix (a container agent).
        self._pids = ("self",) if str(files.root) == "/" else ("1", "self")
        self._capacity = _CapacityProbe(str(files.root), self.config.statvfs_timeout,
                                        self.config.statvfs or os.statvfs)
        self._capacity.inline = self.config.statvfs_inline
        self._capacity_cache: dict[str, tuple[dict[str, int] | None, str | None]] = {}
        self._capacity_at = -1e18
        self._gpfs_at = -1e18
        self._gpfs: dict[str, Any] = {}
        self._gpfs_error: str | None = None
        self._kinds: dict[str, str] = {}
        self._inventory: dict[str, list[dict[str, Any]]] = {"filesystems": [], "disks": []}
        self._last_mounts: list[Mount] = []
        self.errors: dict[str, str] = {}
        # Cumulative counters for /metrics, by mount point and by disk; off the wire.
        self.fs_totals: dict[str, dict[str, int]] = {}
        self.disk_totals: dict[str, dict[str, int]] = {}
        self._seen_disks: set[str] = set()
        self._llite: list[tuple[str, str]] | None = None
        self._llite_mounts: list[tuple[str, int]] = []
        self._llite_reads = 0

    def close(self) -> None:
        self._capacity.close()

    def inventory(self) -> dict[str, list[dict[str, Any]]]:
        return {k: [dict(x) for x in v] for k, v in self._inventory.items()}

    # -- sampling ---------------------------------------------------------------------

    def collect(self, now: float) -> tuple[dict[str, Any], bool]:
        self.errors = {}
        mounts = self._mounts()
        filesystems: dict[str, dict[str, Any]] = {}
        for m in mounts:
            if m.fstype in DATA_FSTYPES and m.mountpoint not in filesystems:
                filesystems[m.mountpoint] = {"id": m.mountpoint, "fstype": m.fstype,
                                             "source": m.source}
        self._lustre(filesystems, mounts, now)
        self._nfs(filesystems, now)
        self._gpfs_stats(filesystems, mounts, now)
        self._capacities(filesystems, now)
        disks = self._disks(now)
        inventory = {
            "filesystems": [{"id": f["id"], "fstype": f["fstype"], "source": f["source"]}
                            for f in filesystems.values()],
            "disks": [{"id": d["id"], "kind": d["kind"]} for d in disks],
        }
        changed = inventory != self._inventory
        self._inventory = inventory
        # Keyed by the cleaned ids the sample carries (the agent cleans it on its way out).
        self.fs_totals = {clean(f["id"]): f.pop("totals") for f in filesystems.values()
                          if "totals" in f}
        self.disk_totals = {clean(d["id"]): d.pop("totals") for d in disks}
        out: dict[str, Any] = {"filesystems": list(filesystems.values()), "disks": disks}
        if self.errors:
            out["errors"] = dict(self.errors)
        return out, changed

    def _read_proc(self, name: str) -> tuple[str, str]:
        """A per-process /proc file of the host's mount namespace: (path, text)."""
        error: ReadError | None = None
        for pid in self._pids:
            path = f"proc/{pid}/{name}"
            try:
                return path, self.files.read_often(path)
            except ReadError as exc:
                error = error or exc
        assert error is not None
        raise error

    def _mounts(self) -> list[Mount]:
        try:
            mounts = parse_mounts(self._read_proc("mounts")[1])
        except ReadError as exc:
            # A read that failed (no descriptor left, a /proc hiccup) is not a node that
            # lost its file systems: the mounts read before stand, and the reason shows.
            self.errors["mounts"] = (f"{exc.path}: {exc.reason}" + (
                "; showing the mounts read before" if self._last_mounts else ""))
            return self._last_mounts
        self._last_mounts = mounts
        return mounts

    def _rate_fields(self, entry: dict[str, Any], key: str, now: float,
                     counters: Mapping[str, int | None]) -> None:
        for name, value in counters.items():
            entry[f"{name}_s"] = self._rates.rate((key, name), value, now)

    def _lustre(self, filesystems: dict[str, dict[str, Any]], mounts: list[Mount],
                now: float) -> None:
        """One entry per Lustre file system, its client statistics summed over every
        llite instance of it. Each mount of a file system (the same one twice, or a
        subdirectory of it) is a client instance of its own, and nothing under /proc or
        /sys says which instance is which mount point; their sum is what this node reads
        from and writes to that file system. The entry's id is its first mount point and
        `mounts` lists them all."""
        by_fs: dict[str, list[Mount]] = {}
        for m in mounts:
            if m.fstype == "lustre":
                by_fs.setdefault(lustre_source_fsname(m.source), []).append(m)
        for fs_mounts in by_fs.values():
            fs_mounts.sort(key=lambda m: (len(m.mountpoint), m.mountpoint))
            for extra in fs_mounts[1:]:  # one entry per file system, not per mount
                filesystems.pop(extra.mountpoint, None)
        sums: dict[str, dict[str, int]] = {}
        errors: dict[str, str] = {}
        for fsname, path in self._llite_instances(by_fs):
            try:
                st = parse_llite_stats(self.files.read_often(path))
            except (ReadError, FormatError) as exc:
                errors[fsname] = f"{path}: {getattr(exc, 'reason', exc)}"
                self._llite_reads = -1  # an instance that went away: list them again
                continue
            acc = sums.setdefault(fsname, {})
            for key, value in (("read_bytes", st.read_bytes), ("write_bytes", st.write_bytes),
                               ("read_ops", st.reads), ("write_ops", st.writes),
                               ("metadata_ops", st.metadata_ops),
                               ("instances", 1)):
                acc[key] = acc.get(key, 0) + (value or 0)
        for fsname in sorted(set(sums) | set(errors)):
            fs_mounts = by_fs.get(fsname, [])
            mountpoint = fs_mounts[0].mountpoint if fs_mounts else f"lustre:{fsname}"
            entry = filesystems.setdefault(mountpoint, {
                "id": mountpoint, "fstype": "lustre",
                "source": fs_mounts[0].source if fs_mounts else fsname})
            entry["fstype"] = "lustre"
            if len(fs_mounts) > 1:
                entry["mounts"] = [m.mountpoint for m in fs_mounts]
            if fsname in errors:
                entry["error"] = errors[fsname]
            summed = sums.get(fsname)
            if summed is None:
                continue
            entry["instances"] = summed.pop("instances")
            entry["totals"] = {"read_bytes": summed["read_bytes"],
                               "write_bytes": summed["write_bytes"]}
            self._rate_fields(entry, mountpoint, now, summed)

    def _llite_instances(self, by_fs: dict[str, list[Mount]]) -> list[tuple[str, str]]:
        """Each Lustre client instance's (file system, stats path): listed again every
        LIST_EVERY samples, when the Lustre mounts change, or when a read fails (a client
        instance comes with a mount and goes with it)."""
        mounted = sorted((name, len(ms)) for name, ms in by_fs.items())
        self._llite_reads += 1
        if (self._llite is not None and mounted == self._llite_mounts
                and self._llite_reads % LIST_EVERY):
            return self._llite
        self._llite_reads = 0
        found: list[tuple[str, str]] = []
        for base in LLITE_DIRS:
            try:
                instances = self.files.listdir(base)
            except ReadError:
                continue
            found.extend((lustre_fsname(i), f"{base}/{i}/stats") for i in instances)
        for _, gone in set(self._llite or ()) - set(found):
            self.files.forget(gone)  # its kept descriptor would read the unmounted one
        self._llite, self._llite_mounts = found, mounted
        return found

    def _nfs(self, filesystems: dict[str, dict[str, Any]], now: float) -> None:
        try:
            path, text = self._read_proc("mountstats")
        except ReadError:
            return  # no NFS client statistics on this kernel or in this container
        try:
            mounts = parse_mountstats(text)
        except FormatError as exc:
            self.errors["nfs"] = f"{path}: {exc}"
            return
        for m in mounts:
            entry = filesystems.setdefault(m.mountpoint, {"id": m.mountpoint,
                                                          "fstype": m.fstype,
                                                          "source": m.device})
            entry["totals"] = {"read_bytes": m.read_bytes, "write_bytes": m.write_bytes}
            reads = m.ops.get("READ")
            writes = m.ops.get("WRITE")
            meta = sum(op.ops for name, op in m.ops.items() if name not in ("READ", "WRITE"))
            self._rate_fields(entry, m.mountpoint, now, {
                "read_bytes": m.read_bytes, "write_bytes": m.write_bytes,
                "read_ops": reads.ops if reads else None,
                "write_ops": writes.ops if writes else None,
                "metadata_ops": meta})
            latency: dict[str, float | None] = {}
            for name, op in m.ops.items():
                d_ops = self._rates.rate((m.mountpoint, "ops", name), op.ops, now)
                d_ms = self._rates.rate((m.mountpoint, "ms", name), op.execute_ms, now)
                latency[name] = (d_ms / d_ops / 1000.0) if d_ops and d_ms is not None else None
            entry["latency"] = latency

    def _gpfs_stats(self, filesystems: dict[str, dict[str, Any]], mounts: list[Mount],
                    now: float) -> None:
        mmpmon = self.config.mmpmon
        gpfs_mounts = {m.source.rsplit("/", 1)[-1]: m for m in mounts if m.fstype == "gpfs"}
        if not gpfs_mounts:
            return
        if not mmpmon or not os.access(mmpmon, os.X_OK):
            # GPFS is mounted but its statistics cannot be asked for: say so on each.
            why = ("no GPFS statistics: mmpmon is off (--mmpmon PATH)" if not mmpmon else
                   f"no GPFS statistics: {mmpmon} is missing or not executable "
                   "(--mmpmon PATH)")
            for m in gpfs_mounts.values():
                entry = filesystems.setdefault(m.mountpoint, {
                    "id": m.mountpoint, "fstype": "gpfs", "source": m.source})
                entry["error"] = why
            return
        if now - self._gpfs_at >= self.config.gpfs_period:
            self._gpfs_at = now
            try:
                proc = subprocess.run([mmpmon, "-p", "-s"], input="fs_io_s\n",
                                      capture_output=True, text=True,
                                      timeout=self.config.gpfs_timeout, check=False)
                stats = parse_mmpmon_fs_io_s(proc.stdout)
                self._gpfs = {s.filesystem: s for s in stats}
                self._gpfs_error = None if stats or proc.returncode == 0 else (
                    f"mmpmon exited {proc.returncode}: {proc.stderr.strip()[:120]}")
            except subprocess.TimeoutExpired:
                self._gpfs_error = f"mmpmon did not answer in {self.config.gpfs_timeout:g} s"
            except (OSError, FormatError) as exc:
                self._gpfs_error = f"mmpmon: {exc}"
        for name, m in gpfs_mounts.items():
            entry = filesystems.setdefault(m.mountpoint, {"id": m.mountpoint, "fstype": "gpfs",
                                                          "source": m.source})
            if self._gpfs_error:
                entry["error"] = self._gpfs_error
            st = self._gpfs.get(name)
            if st is None:
                continue
            entry["totals"] = {"read_bytes": st.read_bytes, "write_bytes": st.write_bytes}
            # Rates over the mmpmon period: the same values until the next call.
            key = (m.mountpoint, "gpfs")
            cached = self._gpfs_rates(key, st, self._gpfs_at)
            entry.update(cached)

    def _gpfs_rates(self, key: tuple[str, str], st: Any, at: float) -> dict[str, Any]:
        counters = {"read_bytes": st.read_bytes, "write_bytes": st.write_bytes,
                    "read_ops": st.reads, "write_ops": st.writes,
                    "metadata_ops": st.opens + st.closes + st.readdirs + st.inode_updates}
        cache = self._gpfs_cache = getattr(self, "_gpfs_cache", {})
        if cache.get(key, (None,))[0] != at:
            rates = {f"{n}_s": self._rates.rate((key, n), v, at) for n, v in counters.items()}
            cache[key] = (at, rates)
        return dict(cache[key][1])

    def _capacities(self, filesystems: dict[str, dict[str, Any]], now: float) -> None:
        if now - self._capacity_at >= self.config.capacity_period or any(
                fs not in self._capacity_cache for fs in filesystems):
            self._capacity_at = now
            for mountpoint in filesystems:
                if mountpoint.startswith("lustre:"):
                    continue  # not mounted here: no path to ask
                self._capacity_cache[mountpoint] = self._capacity.probe(mountpoint)
        for mountpoint, entry in filesystems.items():
            values, error = self._capacity_cache.get(mountpoint, (None, None))
            if values:
                entry.update(values)
            if error:
                entry["capacity_error"] = error

    def _disks(self, now: float) -> list[dict[str, Any]]:
        try:
            stats = parse_diskstats(self.files.read_often("proc/diskstats"))
        except (ReadError, FormatError) as exc:
            self.errors["disks"] = f"proc/diskstats: {getattr(exc, 'reason', exc)}"
            return []
        out = []
        for d in stats:
            kind = self._kind(d.name)
            if (kind == "virtual" and d.reads == 0 and d.writes == 0
                    and d.name not in self._seen_disks and _IDLE_SKIP.match(d.name)):
                continue  # unused loop, ram and optical devices
            self._seen_disks.add(d.name)
            rb, wb = d.read_sectors * SECTOR, d.write_sectors * SECTOR
            # One remembered read a disk: its line's counters are read at one moment.
            rb_s, wb_s, r_s, w_s, d_ms, d_io, busy = self._disk_rates.rates(d.name, (
                rb, wb, d.reads, d.writes, d.read_ms + d.write_ms, d.reads + d.writes,
                d.io_ms), now)
            out.append({
                "id": d.name, "kind": kind,
                "totals": {"read_bytes": rb, "written_bytes": wb},
                "read_bytes_s": rb_s, "write_bytes_s": wb_s,
                "read_iops": r_s, "write_iops": w_s,
                "await": (d_ms / d_io / 1000.0) if d_io and d_ms is not None else (
                    0.0 if d_io == 0 else None),
                "busy": min(1.0, busy / 1000.0) if busy is not None else None})
        return out

    def _kind(self, name: str) -> str:
        kind = self._kinds.get(name)
        if kind is None:
            if self.files.exists(f"sys/devices/virtual/block/{name}"):
                kind = "virtual"
            elif self.files.exists(f"sys/class/block/{name}/partition"):
                kind = "partition"
            elif self.files.exists(f"sys/block/{name}"):
                kind = "disk"
            else:
                kind = disk_kind_from_name(name)
            self._kinds[name] = kind
        return kind
