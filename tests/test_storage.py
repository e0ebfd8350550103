"""Storage collector on temporary /proc and /sys trees (and a stand-in mmpmon)."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from agent.collectors.storage import StorageCollector, StorageConfig
from agent.collectors.storage_parsers import (
    FormatError,
    disk_kind_from_name,
    lustre_fsname,
    parse_diskstats,
    parse_llite_stats,
    parse_mmpmon_fs_io_s,
    parse_mountstats,
)
from agent.files import FileTree
from tests.trees import diskstats_line, llite_stats, mountstats_nfs, write


def fs(values: dict, mount: str) -> dict:
    return next(f for f in values["filesystems"] if f["id"] == mount)


def collector(root: Path, **config: object) -> StorageCollector:
    return StorageCollector(FileTree(root), StorageConfig(**config))  # type: ignore[arg-type]


@pytest.mark.parametrize("llite_dir", ["proc/fs/lustre/llite", "sys/kernel/debug/lustre/llite"])
def test_lustre_rates_per_file_system_from_both_locations(tmp_path: Path, llite_dir: str) -> None:
    write(tmp_path / "proc/self/mounts",
          "10.0.0.1@o2ib:/scratch /lustre/scratch lustre rw,flock 0 0\n")
    stats = tmp_path / llite_dir / "scratch-ffff88105db50000/stats"
    write(stats, llite_stats(10**9, 100, 0, 0, opens=10, getattrs=5))
    c = collector(tmp_path)
    values, _ = c.collect(0.0)
    entry = fs(values, "/lustre/scratch")
    assert entry["fstype"] == "lustre" and c.fs_totals["/lustre/scratch"]["read_bytes"] == 10**9
    assert entry["read_bytes_s"] is None
    write(stats, llite_stats(3 * 10**9, 300, 5 * 10**8, 50, opens=30, getattrs=25))
    entry = fs(c.collect(2.0)[0], "/lustre/scratch")
    assert entry["read_bytes_s"] == 1e9 and entry["write_bytes_s"] == 2.5e8
    assert entry["read_ops_s"] == 100.0 and entry["write_ops_s"] == 25.0
    # open + close + getattr, not inode_permission.
    assert entry["metadata_ops_s"] == (20 + 20 + 20) / 2


def test_llite_stats_garbage_is_a_reason_not_a_crash(tmp_path: Path) -> None:
    write(tmp_path / "proc/fs/lustre/llite/work-ffff000189257000/stats",
          "read_bytes notanumber samples [bytes] 1 2 3\n")
    values, _ = collector(tmp_path).collect(0.0)
    entry = fs(values, "lustre:work")  # not in the mount table: named by file system
    assert "bad count" in entry["error"]


def test_parse_llite_stats_2_16_layout() -> None:
    st = parse_llite_stats(
        "snapshot_time 1790277040.611962111 secs.nsecs\n"
        "start_time 1790008165.367572621 secs.nsecs\n"
        "read_bytes                57406355 samples [bytes] 1 4194304 1496254921055 472\n"
        "write_bytes               16229451 samples [bytes] 1 16777216 1184274862535 265\n"
        "setattr                   45511804 samples [usecs] 102 447829 18120558851 10598\n")
    assert (st.read_bytes, st.reads) == (1496254921055, 57406355)
    assert (st.write_bytes, st.writes) == (1184274862535, 16229451)
    assert st.metadata_ops == 45511804
    assert lustre_fsname("a361000-ffff000189257000") == "a361000"
    assert lustre_fsname("plainname") == "plainname"


MMPMON = """_fs_io_s_ _n_ 10.0.0.5 _nn_ gpu001 _rc_ 0 _t_ 1579358234 _tu_ 53212 _cl_ gpfs.site \
_fs_ {fs} _d_ 48 _br_ {br} _bw_ {bw} _oc_ 10 _cc_ 10 _rdc_ {rdc} _wc_ 5 _dir_ 1 _iu_ 2
"""


def _fake_mmpmon(tmp_path: Path, br: int, bw: int, rdc: int) -> Path:
    script = tmp_path / "mmpmon"
    answer = MMPMON.format(fs="scratch", br=br, bw=bw, rdc=rdc).strip()
    script.write_text("#!/bin/sh\n# answers fs_io_s like IBM's mmpmon -p -s\n"
                      f"read request\nprintf '%s\\n' '{answer}'\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_gpfs_from_mmpmon_with_rates(tmp_path: Path) -> None:
    write(tmp_path / "proc/self/mounts", "scratch /gpfs/scratch gpfs rw 0 0\n")
    mmpmon = _fake_mmpmon(tmp_path, 1000, 0, 10)
    c = collector(tmp_path, mmpmon=str(mmpmon), gpfs_period=0.0)
    entry = fs(c.collect(0.0)[0], "/gpfs/scratch")
    assert c.fs_totals["/gpfs/scratch"] == {"read_bytes": 1000, "write_bytes": 0}
    _fake_mmpmon(tmp_path, 5000, 800, 30)
    entry = fs(c.collect(4.0)[0], "/gpfs/scratch")
    assert entry["read_bytes_s"] == 1000.0 and entry["write_bytes_s"] == 200.0
    assert entry["read_ops_s"] == 5.0


def test_gpfs_mmpmon_that_hangs_is_reported_and_sampling_goes_on(tmp_path: Path) -> None:
    write(tmp_path / "proc/self/mounts", "scratch /gpfs/scratch gpfs rw 0 0\n")
    script = tmp_path / "mmpmon"
    script.write_text("#!/bin/sh\nexec sleep 30\n")
    script.chmod(0o755)
    c = collector(tmp_path, mmpmon=str(script), gpfs_period=0.0, gpfs_timeout=0.3)
    entry = fs(c.collect(0.0)[0], "/gpfs/scratch")
    assert "did not answer" in entry["error"]


def test_parse_mmpmon_rejects_bad_answers() -> None:
    assert parse_mmpmon_fs_io_s("") == []
    with pytest.raises(FormatError, match="rc 1"):
        parse_mmpmon_fs_io_s("_fs_io_s_ _rc_ 1 _fs_ x\n")
    with pytest.raises(FormatError, match="lacks"):
        parse_mmpmon_fs_io_s("_fs_io_s_ _rc_ 0 _fs_ x _br_ 1\n")


def test_nfs_bytes_are_normal_plus_direct_and_latency_per_op(tmp_path: Path) -> None:
    write(tmp_path / "proc/self/mounts", "srv:/export /mnt/data nfs4 rw 0 0\n")
    ms = tmp_path / "proc/self/mountstats"
    write(ms, "device proc mounted on /proc with fstype proc\n"
          + mountstats_nfs("/mnt/data", 1000, 2000, 500, 0, read_ops=10, read_ms=50))
    c = collector(tmp_path)
    entry = fs(c.collect(0.0)[0], "/mnt/data")
    assert c.fs_totals["/mnt/data"] == {"read_bytes": 1500, "write_bytes": 2000}
    write(ms, mountstats_nfs("/mnt/data", 3000, 2000, 1500, 0, read_ops=30, read_ms=150))
    entry = fs(c.collect(1.0)[0], "/mnt/data")
    assert entry["read_bytes_s"] == 3000.0
    assert entry["latency"]["READ"] == pytest.approx(0.005)  # 100 ms over 20 ops
    assert entry["read_ops_s"] == 20.0


def test_mountstats_with_spaces_and_short_lines() -> None:
    text = mountstats_nfs("/mnt/my\\040data", 1, 2, 3, 4)
    assert parse_mountstats(text)[0].mountpoint == "/mnt/my data"
    with pytest.raises(FormatError, match="bytes line"):
        parse_mountstats("device a:/b mounted on /m with fstype nfs\n\tbytes:\t1 2\n")


def test_disks_rates_await_busy_and_kinds(tmp_path: Path) -> None:
    (tmp_path / "sys/block/nvme0n1").mkdir(parents=True)
    (tmp_path / "sys/class/block/nvme0n1p1").mkdir(parents=True)
    write(tmp_path / "sys/class/block/nvme0n1p1/partition", "1\n")
    (tmp_path / "sys/devices/virtual/block/dm-0").mkdir(parents=True)
    ds = tmp_path / "proc/diskstats"
    write(ds, diskstats_line(259, 0, "nvme0n1", reads=100, rsect=1000)
          + diskstats_line(259, 1, "nvme0n1p1", reads=100, rsect=1000)
          + diskstats_line(252, 0, "dm-0", reads=1)
          + diskstats_line(7, 0, "loop0"))
    c = collector(tmp_path)
    values, _ = c.collect(0.0)
    kinds = {d["id"]: d["kind"] for d in values["disks"]}
    assert kinds == {"nvme0n1": "disk", "nvme0n1p1": "partition", "dm-0": "virtual"}
    write(ds, diskstats_line(259, 0, "nvme0n1", reads=300, rsect=5000, rms=400, writes=100,
                             wsect=2000, wms=200, io_ms=500)
          + diskstats_line(259, 1, "nvme0n1p1", reads=100, rsect=1000))
    d = next(x for x in c.collect(1.0)[0]["disks"] if x["id"] == "nvme0n1")
    assert d["read_bytes_s"] == 4000 * 512 and d["write_bytes_s"] == 2000 * 512
    assert d["read_iops"] == 200.0 and d["write_iops"] == 100.0
    assert d["await"] == pytest.approx(600 / 300 / 1000)
    assert d["busy"] == 0.5
    assert c.disk_totals["nvme0n1"] == {"read_bytes": 5000 * 512, "written_bytes": 2000 * 512}


def test_diskstats_garbage_is_a_reason(tmp_path: Path) -> None:
    write(tmp_path / "proc/diskstats", "8 0 sda x y z\n")
    values, _ = collector(tmp_path).collect(0.0)
    assert values["disks"] == [] and "proc/diskstats" in values["errors"]["disks"]
    with pytest.raises(FormatError):
        parse_diskstats("8 0 sda 1 2 3 4 5 6 7 8 9 10 eleven\n")


@pytest.mark.parametrize(("name", "kind"), [
    ("sda", "disk"), ("sda1", "partition"), ("nvme0n1", "disk"), ("nvme0n1p2", "partition"),
    ("mmcblk0p1", "partition"), ("dm-3", "virtual"), ("loop7", "virtual"), ("md0", "virtual"),
])
def test_disk_kind_fallback_from_names(name: str, kind: str) -> None:
    assert disk_kind_from_name(name) == kind


def test_capacity_of_data_file_systems_only(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    write(tmp_path / "proc/self/mounts",
          "/dev/nvme0n1 /data xfs rw 0 0\nproc /proc proc rw 0 0\ntmpfs /run tmpfs rw 0 0\n"
          "overlay / overlay rw 0 0\n")
    values, _ = collector(tmp_path).collect(0.0)
    assert [f["id"] for f in values["filesystems"]] == ["/data"]
    entry = values["filesystems"][0]
    st = os.statvfs(data)
    assert entry["size"] == st.f_blocks * st.f_frsize
    assert 0 < entry["free"] <= entry["size"] and entry["inodes"] > 0


def test_a_hung_statvfs_is_reported_and_not_called_again(tmp_path: Path) -> None:
    (tmp_path / "nfs").mkdir()
    write(tmp_path / "proc/self/mounts", "srv:/x /nfs nfs4 rw 0 0\n")
    release = threading.Event()
    calls = []

    def hanging_statvfs(path: str) -> os.statvfs_result:
        calls.append(path)
        release.wait(10)  # a dead NFS server
        return os.statvfs("/")

    c = collector(tmp_path, statvfs_timeout=0.2, capacity_period=0.0)
    c._capacity.statvfs = hanging_statvfs
    try:
        entry = fs(c.collect(0.0)[0], "/nfs")
        assert "timed out" in entry["capacity_error"] and "size" not in entry
        entry = fs(c.collect(1.0)[0], "/nfs")
        assert "has not returned" in entry["capacity_error"]
        assert len(calls) == 1
    finally:
        release.set()
        c.close()


def test_missing_mount_table_is_a_reason(tmp_path: Path) -> None:
    values, _ = collector(tmp_path).collect(0.0)
    assert "missing" in values["errors"]["mounts"]


def test_a_write_surge_is_a_minute_held_far_above_the_nodes_own_level() -> None:
    """Checkpoints of 20 s every 3 minutes at 4 GB/s are the node's normal: nothing; the
    same writes without a pause are a surge once held a minute, and go when the writes
    fall back to the normal pattern."""
    from tuimon_core.write_surge import WriteSurge

    surge = WriteSurge("gpu001")
    fs = {"id": "/lustre/scratch", "fstype": "lustre"}
    raised: list[float] = []
    t = 0.0

    def run(seconds: float, storm: bool) -> None:
        nonlocal t
        for _ in range(int(seconds)):
            t += 1.0
            writing = storm or t % 180 < 20
            surge.observe([{**fs, "write_bytes_s": 4e9 if writing else 1e6},
                           {"id": "/tmp", "fstype": "xfs", "write_bytes_s": 9e9}], t, 1.0)
            if surge.conditions(t):
                raised.append(t)

    run(1800, storm=False)
    assert raised == []
    run(120, storm=True)
    # Held a minute of 10-s buckets (the writes began with the checkpoint due at 1800).
    assert raised and 1800 + 50 <= raised[0] <= 1800 + 75, raised[:3]
    (finding,) = surge.conditions(t)
    assert finding.fs == "/lustre/scratch" and finding.severity == "info"
    assert "x40 its level (under 100.0 MB/s)" in finding.message, finding.message
    run(40, storm=False)
    assert not surge.conditions(t)


def test_a_write_surge_on_a_mount_that_no_longer_reports_is_not_said() -> None:
    """A mount that stops giving its writes (unmounted, unreadable) does not keep its
    surge for ever: not known to hold, it is not said."""
    from tuimon_core.write_surge import STALE_S, WriteSurge

    surge = WriteSurge("gpu001")
    fs = {"id": "/lustre/scratch", "fstype": "lustre"}
    t = 0.0
    for writing in [False] * 120 + [True] * 90:
        t += 1.0
        surge.observe([{**fs, "write_bytes_s": 4e9 if writing else 1e6}], t, 1.0)
    assert surge.conditions(t)
    for _ in range(int(STALE_S) + 1):
        t += 1.0
        surge.observe([], t, 1.0)
    assert surge.conditions(t) == []
