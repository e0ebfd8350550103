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
    assert "argument --interval: must be in [0.01, 3600], got 0" in out.stderr


def _wait_port(port: int, timeout: float = 20.0) -> None:
    import socket
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError(f"nothing listens on {port}")


def test_a_second_agent_is_refused_and_the_first_keeps_its_telemetry(tmp_path: Path) -> None:
    import socket

    from agent.reporter import StepReporter

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sock = str(tmp_path / "steps.sock")
    first = subprocess.Popen(
        [sys.executable, "-m", "agent", "run", "--listen", f"127.0.0.1:{port}",
         "--steps-socket", sock, "--log-level", "warning"], cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, stderr=subprocess.DEVNULL)
    try:
        _wait_port(port)
        for args in ([f"127.0.0.1:{port}", "--steps-socket", str(tmp_path / "other.sock")],
                     [f"127.0.0.1:{port + 1}", "--steps-socket", sock]):
            second = subprocess.run(
                [sys.executable, "-m", "agent", "run", "--listen", *args], cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                timeout=30)
            assert second.returncode == 2, second.stderr
            assert "in use" in second.stderr and "Traceback" not in second.stderr
            # Not first "tuimon-agent ... on http://HOST:PORT": that is said once it listens.
            assert "on http://" not in second.stderr, second.stderr
        reporter = StepReporter("train", 0, 1, socket_path=sock)
        reporter.report(1.0, 0.5)
        assert reporter.sent == 1 and Path(sock).exists()
    finally:
        first.terminate()
        first.wait(10)
    assert not Path(sock).exists()  # the first removes its own on the way out


def test_a_second_demo_takes_free_ports_and_says_so() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        base = s.getsockname()[1] // 4 * 4 % 50000 + 10000
    first = subprocess.Popen(
        [sys.executable, "-m", "tuimon.cli", "demo", "--nodes", "2", "--gpus", "1",
         "--base-port", str(base), "--plain"], cwd=ROOT, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        _wait_port(base + 1)
        second = subprocess.run(
            [sys.executable, "-m", "tuimon.cli", "demo", "--nodes", "2", "--gpus", "1",
             "--base-port", str(base), "--once", "--scenario", "healthy"], cwd=ROOT,
            capture_output=True, text=True,
            timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    finally:
        first.terminate()
        first.wait(10)
    assert second.returncode == 0, second.stderr
    assert "are in use" in second.stderr
    assert "nodes up 2" in second.stdout and "sim-node000" in second.stdout


def test_once_text_shows_ports_file_systems_and_disks(tmp_path: Path) -> None:
    from tests.trees import diskstats_line, unttar, write

    root = write_proc(tmp_path)
    unttar((ROOT / "tests/fixtures/real/sysfs_infiniband_mlx5_0.ttar").read_text(), root)
    write(root / "proc/self/mounts", "/dev/md0 /data xfs rw 0 0\n")
    (root / "data").mkdir()
    write(root / "proc/diskstats", diskstats_line(259, 0, "nvme0n1", reads=5, rsect=8))
    out = _run("once", "--interval", "0.2", "--root", str(root), "--node-name", "n1")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "mlx5_0:1" in text and "ACTIVE" in text  # the port, from a real mlx5 tree
    assert "/data" in text and "xfs" in text and "nvme0n1" in text


def test_once_gives_the_verdict_status_gives_for_nodes_never_reached() -> None:
    """`connect --once` to an agent that never answers prints what `status` prints, the
    node never reached, and exits as status does: nothing reached is UNKNOWN (3), not an
    OK with an empty table."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]  # nothing listens here once the socket closes
    runs = [subprocess.run([sys.executable, "-m", "tuimon.cli", command, f"127.0.0.1:{dead}",
                            *extra], cwd=ROOT, capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
            for command, extra in (("connect", ["--once"]), ("status", []))]
    for run in runs:
        assert run.returncode == 3, (run.returncode, run.stdout, run.stderr)
        assert "UNKNOWN: nodes 0 up / 0 stale / 0 down / 1 never reached" in run.stdout, \
            run.stdout
        assert f"critical 1 node never reached: 127.0.0.1:{dead}" in run.stdout, run.stdout
