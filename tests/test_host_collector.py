"""Host collector on temporary /proc trees, including garbage and missing files."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.collectors.host import HostCollector
from agent.files import FileTree
from tests.conftest import write_proc
from tests.trees import read_as_unprivileged


def test_reads_load_memory_uptime_and_cpu_from_deltas(proc_root: Path) -> None:
    c = HostCollector(FileTree(proc_root))
    first = c.collect(0.0)
    assert first["cpu_util"] is None  # one read is not a rate
    assert first["cpus"] == 2
    assert (first["load1"], first["load5"], first["load15"]) == (1.5, 1.25, 1.0)
    assert first["mem_total"] == 16384000 * 1024
    assert first["mem_available"] == 8192000 * 1024
    assert first["mem_used"] == (16384000 - 8192000) * 1024
    assert first["uptime"] == 3600.5
    # 300 busy jiffies out of 1000 since the first read.
    (proc_root / "proc/stat").write_text("cpu  1200 0 600 8700 500 0 0 0 0 0\ncpu0 1\n")
    second = c.collect(1.0)
    assert second["cpu_util"] == pytest.approx(0.3)
    assert "errors" not in second
    assert c.boot_id() == "0b6f2bd6-6d3c-4b34-9c5a-1f0c6d1f6a11"


def test_garbage_and_missing_files_fail_only_their_fields(proc_root: Path) -> None:
    (proc_root / "proc/loadavg").write_text("\x00\xffgarbage")
    (proc_root / "proc/uptime").unlink()
    values = HostCollector(FileTree(proc_root)).collect(0.0)
    assert values["load1"] is None and values["uptime"] is None
    assert values["mem_total"] == 16384000 * 1024
    assert "proc/loadavg" in values["errors"]["load1"]
    assert values["errors"]["uptime"] == "proc/uptime: missing"


def test_permission_denied_is_a_reason(proc_root: Path) -> None:
    import json

    (proc_root / "proc/meminfo").chmod(0)
    values = json.loads(read_as_unprivileged(
        "import json\nfrom agent.collectors.host import HostCollector\n"
        "from agent.files import FileTree\n"
        f"print(json.dumps(HostCollector(FileTree({str(proc_root)!r})).collect(0.0)))"))
    assert values["errors"]["mem_total"] == "proc/meminfo: permission denied"
    assert values["load1"] == 1.5


def test_unreadable_directory_instead_of_file_is_a_reason(proc_root: Path) -> None:
    (proc_root / "proc/meminfo").unlink()
    (proc_root / "proc/meminfo").mkdir()
    values = HostCollector(FileTree(proc_root)).collect(0.0)
    assert values["mem_total"] is None
    assert values["errors"]["mem_total"].startswith("proc/meminfo:")


def test_old_kernel_without_memavailable(tmp_path: Path) -> None:
    root = write_proc(tmp_path, meminfo="MemTotal: 1000 kB\nMemFree: 100 kB\nBuffers: 50 kB\n"
                                        "Cached: 250 kB\n")
    values = HostCollector(FileTree(root)).collect(0.0)
    assert values["mem_available"] == 400 * 1024


def test_counter_going_backwards_gives_no_cpu_rate(proc_root: Path) -> None:
    c = HostCollector(FileTree(proc_root))
    c.collect(0.0)
    (proc_root / "proc/stat").write_text("cpu  10 0 5 80 5 0 0 0 0 0\n")
    assert c.collect(1.0)["cpu_util"] is None


def test_load_average_is_reread_on_the_kernels_5_s_period(proc_root: Path) -> None:
    c = HostCollector(FileTree(proc_root))
    assert c.collect(0.0)["load1"] == 1.5
    (proc_root / "proc/loadavg").write_text("9.00 8.00 7.00 1/1 1\n")
    assert c.collect(1.0)["load1"] == 1.5  # the kernel has not recomputed it yet either
    assert c.collect(5.0)["load1"] == 9.0
    # Uptime moves with the monotonic clock between reads of /proc/uptime.
    assert c.collect(7.5)["uptime"] == 3600.5 + 7.5
