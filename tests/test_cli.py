"""`tuimon-agent once` as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import write_proc

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # No NVIDIA library on CI machines: the real pynvml fails to load, as on a login node.
    return subprocess.run([sys.executable, "-m", "agent", *args], capture_output=True,
                          text=True, timeout=60, env=env)


def test_once_json_without_a_gpu_exits_0_and_says_why(tmp_path: Path) -> None:
    root = write_proc(tmp_path)
    out = _run("once", "--json", "--interval", "0.2", "--root", str(root), "--node-name", "n1")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["node"] == "n1"
    assert report["inventory"] == []
    assert "NVML" in report["gpu_status"] and report["gpu_status"] != "ok"
    host = report["sample"]["host"]
    assert host["mem_total"] == 16384000 * 1024
    assert host["load1"] == 1.5


def test_once_table_on_the_real_machine() -> None:
    out = _run("once", "--interval", "0.2")
    assert out.returncode == 0, out.stderr
    assert "GPUs:" in out.stdout and "host: cpu" in out.stdout


def test_once_exits_1_when_nothing_can_be_read(tmp_path: Path) -> None:
    out = _run("once", "--json", "--interval", "0.1", "--root", str(tmp_path / "empty"))
    assert out.returncode == 1
    report = json.loads(out.stdout)
    assert report["sample"]["host"]["errors"]["mem_total"] == "proc/meminfo: missing"


def test_bad_interval_is_a_clear_error() -> None:
    out = _run("once", "--interval", "0")
    assert out.returncode == 2
    assert "interval must be between" in out.stderr
