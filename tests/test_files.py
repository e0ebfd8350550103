"""The agent's file layer: files read every sample through kept descriptors still read
what the path names when a file is rewritten, replaced or removed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.collectors.host import HostCollector
from agent.files import MAX_FILE_BYTES, MISSING, READ_CHUNK, FileTree, ReadError
from tests.trees import write

MEMINFO = "MemTotal: {total} kB\nMemFree: 1000 kB\nMemAvailable: {avail} kB\n"


def test_a_kept_file_rewritten_in_place_reads_anew_on_the_same_descriptor(
        tmp_path: Path) -> None:
    write(tmp_path / "proc/diskstats", "one\n")
    files = FileTree(tmp_path)
    assert files.read_often("proc/diskstats") == "one\n"
    fd = files._fds["proc/diskstats"]
    write(tmp_path / "proc/diskstats", "two, longer\n")
    assert files.read_often("proc/diskstats") == "two, longer\n"
    assert files._fds["proc/diskstats"] == fd  # one pread, no open and close


def test_a_kept_file_replaced_or_removed_is_noticed_by_revalidate(tmp_path: Path) -> None:
    path = tmp_path / "proc/meminfo"
    write(path, "old\n")
    files = FileTree(tmp_path)
    assert files.read_often("proc/meminfo") == "old\n"
    assert files.revalidate() == 0  # nothing changed: nothing closed
    aside = tmp_path / "proc/.meminfo"
    write(aside, "new\n")
    aside.replace(path)  # another file under the same name
    assert files.read_often("proc/meminfo") == "old\n"  # the descriptor's file, until...
    assert files.revalidate() == 1
    assert files.read_often("proc/meminfo") == "new\n"
    path.unlink()
    assert files.revalidate() == 1
    with pytest.raises(ReadError) as err:
        files.read_often("proc/meminfo")
    assert err.value.reason == MISSING
    write(path, "back\n")
    assert files.read_often("proc/meminfo") == "back\n"


def test_a_counter_descriptor_is_revalidated_too(tmp_path: Path) -> None:
    rel = "sys/class/infiniband/mlx5_0/ports/1/counters/port_xmit_data"
    write(tmp_path / rel, "10\n")
    files = FileTree(tmp_path)
    assert int(files.read_counter(rel)) == 10
    (tmp_path / rel).unlink()
    write(tmp_path / rel, "20\n")
    assert files.revalidate() == 1
    assert int(files.read_counter(rel)) == 20


def test_a_file_longer_than_a_read_is_read_whole_and_may_grow(tmp_path: Path) -> None:
    body = "".join(f"cpu{i} 1 2 3 4 5 6 7 8 9 10\n" for i in range(400))
    assert READ_CHUNK < len(body) < MAX_FILE_BYTES
    write(tmp_path / "proc/stat", body)
    files = FileTree(tmp_path)
    assert files.read_often("proc/stat") == body
    longer = body + "".join(f"cpu{i} 1 2 3\n" for i in range(400, 800))
    write(tmp_path / "proc/stat", longer)
    assert files.read_often("proc/stat") == longer
    assert files.read_text("proc/stat") == longer


def test_a_file_past_the_size_bound_is_an_error_with_its_path(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/mounts").write_bytes(b"x" * (MAX_FILE_BYTES + 10))
    files = FileTree(tmp_path)
    for read in (files.read_often, files.read_text):
        with pytest.raises(ReadError) as err:
            read("proc/mounts")
        assert err.value.path == "proc/mounts" and "larger than" in err.value.reason
    assert "proc/mounts" not in files._fds


def test_the_host_reads_a_replaced_meminfo_after_the_agent_revalidates(
        tmp_path: Path) -> None:
    write(tmp_path / "proc/meminfo", MEMINFO.format(total=1000, avail=400))
    files = FileTree(tmp_path)
    host = HostCollector(files)
    assert host.collect(0.0)["mem_used"] == 600 * 1024
    aside = tmp_path / "proc/meminfo.new"
    write(aside, MEMINFO.format(total=1000, avail=900))
    os.replace(aside, tmp_path / "proc/meminfo")
    files.revalidate()
    assert host.collect(1.0)["mem_used"] == 100 * 1024


def test_a_procfs_file_of_many_pages_is_read_to_its_end() -> None:
    """procfs hands a file out a page of records at a time: a short read is not its
    end. /proc/crypto (this machine's own, real procfs) is several pages long and does
    not change while read."""
    if not os.path.exists("/proc/crypto"):
        pytest.skip("this kernel has no /proc/crypto")
    with open("/proc/crypto", "rb") as fh:
        whole = fh.read().decode("utf-8", errors="replace")
    if len(whole) <= READ_CHUNK:
        pytest.skip("/proc/crypto fits one page here")
    files = FileTree("/")
    assert files.read_often("proc/crypto") == whole
    assert files.read_often("proc/crypto") == whole  # again, through the kept descriptor
    assert files.read_text("proc/crypto") == whole
