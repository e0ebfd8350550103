"""Builders of temporary /sys and /proc trees in the formats the kernel writes.

The project's own fixtures, written by the tests themselves (the reference trees under
../shared are for checking by hand, never copied).
"""

from __future__ import annotations

from pathlib import Path

LEGACY = {
    "port_xmit_data": 1000, "port_rcv_data": 2000, "port_xmit_packets": 10,
    "port_rcv_packets": 20, "port_xmit_wait": 5, "symbol_error": 0, "port_rcv_errors": 0,
    "port_rcv_remote_physical_errors": 0, "port_xmit_discards": 0, "link_downed": 0,
    "link_error_recovery": 0, "excessive_buffer_overrun_errors": 0,
    "local_link_integrity_errors": 0,
}
HW = {"np_cnp_sent": 100, "rp_cnp_handled": 50, "np_ecn_marked_roce_packets": 7,
      "out_of_sequence": 0, "packet_seq_err": 0, "local_ack_timeout_err": 0,
      "rnr_nak_retry_err": 0, "out_of_buffer": 0}


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def ib_port(root: Path, device: str, port: int = 1, *, counters: dict[str, object] | None = None,
            ext: dict[str, int] | None = None, hw: dict[str, int] | None = None,
            link_layer: str = "InfiniBand", rate: str = "400 Gb/sec (4X NDR)",
            state: str = "4: ACTIVE", phys_state: str = "5: LinkUp",
            netdev: str | None = None) -> Path:
    dev = root / "sys/class/infiniband" / device
    write(dev / "hca_type", "MT4129\n")
    write(dev / "board_id", "MT_0000000838\n")
    write(dev / "fw_ver", "28.39.1002\n")
    base = dev / "ports" / str(port)
    write(base / "rate", rate + "\n")
    write(base / "state", state + "\n")
    write(base / "phys_state", phys_state + "\n")
    write(base / "link_layer", link_layer + "\n")
    for name, value in {**LEGACY, **(counters or {})}.items():
        if value is not None:
            write(base / "counters" / name, f"{value}\n")
    for name, value in (ext or {}).items():
        write(base / "counters_ext" / name, f"{value}\n")
    for name, value in (hw or {}).items():
        write(base / "hw_counters" / name, f"{value}\n")
    if netdev:
        (dev / "device" / "net" / netdev).mkdir(parents=True, exist_ok=True)
    return base


def nic(root: Path, name: str, *, speed: int = 200000, **stats: int) -> Path:
    base = root / "sys/class/net" / name
    (base / "device").mkdir(parents=True, exist_ok=True)
    write(base / "speed", f"{speed}\n")
    write(base / "operstate", "up\n")
    defaults = {"rx_bytes": 0, "tx_bytes": 0, "rx_packets": 0, "tx_packets": 0,
                "rx_errors": 0, "tx_errors": 0, "rx_dropped": 0, "tx_dropped": 0}
    for counter, value in {**defaults, **stats}.items():
        write(base / "statistics" / counter, f"{value}\n")
    return base


def diskstats_line(major: int, minor: int, name: str, reads: int = 0, rsect: int = 0,
                   rms: int = 0, writes: int = 0, wsect: int = 0, wms: int = 0,
                   io_ms: int = 0) -> str:
    return (f"{major:4d} {minor:7d} {name} {reads} 0 {rsect} {rms} {writes} 0 {wsect} {wms} 0 "
            f"{io_ms} {rms + wms} 0 0 0 0\n")


def llite_stats(read_bytes: int, reads: int, write_bytes: int, writes: int,
                opens: int = 0, getattrs: int = 0) -> str:
    return ("snapshot_time             1790277040.611962111 secs.nsecs\n"
            f"read_bytes                {reads} samples [bytes] 1 4194304 {read_bytes} 9\n"
            f"write_bytes               {writes} samples [bytes] 1 16777216 {write_bytes} 9\n"
            f"open                      {opens} samples [usecs] 0 36643 3420852446 6\n"
            f"close                     {opens} samples [usecs] 0 27750 5798013687 1\n"
            f"getattr                   {getattrs} samples [usecs] 1 59652 4903684132 4\n"
            "inode_permission          922787668 samples [usecs] 0 7416 72809506 8\n")


def mountstats_nfs(mountpoint: str, normal_read: int, normal_write: int, direct_read: int,
                   direct_write: int, read_ops: int = 0, read_ms: int = 0) -> str:
    return (f"device srv:/export mounted on {mountpoint} with fstype nfs4 statvers=1.1\n"
            "\topts:\trw,vers=4.2\n"
            f"\tbytes:\t{normal_read} {normal_write} {direct_read} {direct_write} 0 0 0 0\n"
            "\tRPC iostats version: 1.1  p/v: 100003/4 (nfs)\n"
            "\tper-op statistics\n"
            "\t        NULL: 0 0 0 0 0 0 0 0\n"
            f"\t        READ: {read_ops} {read_ops} 0 100 200 1 {read_ms} {read_ms} 0\n"
            "\t       WRITE: 0 0 0 0 0 0 0 0 0\n")


def read_as_unprivileged(code: str) -> str:
    """Run Python `code` in a child that file permissions apply to, and return its stdout.

    Root reads any file, so as root the child runs without CAP_DAC_OVERRIDE and
    CAP_DAC_READ_SEARCH (util-linux's setpriv); otherwise it runs as it is.
    """
    import os
    import shutil
    import subprocess
    import sys

    import pytest

    cmd = [sys.executable, "-c", code]
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv (util-linux) to drop the override")
        cmd = [setpriv, "--bounding-set", "-dac_override,-dac_read_search", "--", *cmd]
    repo = str(Path(__file__).resolve().parent.parent)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=30,
                         env={**os.environ, "PYTHONPATH": repo})
    assert out.returncode == 0, out.stderr
    return out.stdout


def unttar(text: str, dest: Path, strip: str = "fixtures/") -> None:
    """Unpack a ttar archive (prometheus/procfs's text archive of /sys and /proc trees:
    `Path:`, `Lines:`, the lines, `Mode:`; `Directory:`; `SymlinkTo:`) under `dest`."""
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("Directory: "):
            (dest / line[11:].removeprefix(strip)).mkdir(parents=True, exist_ok=True)
        elif line.startswith("Path: "):
            path = dest / line[6:].removeprefix(strip)
            count = int(lines[i + 1].split(": ", 1)[1])
            body = lines[i + 2:i + 2 + count]
            i += 1 + count
            content = "\n".join(body)
            if content.endswith("EOF"):  # ttar's mark for "no newline at the end"
                content = content[:-3]
            else:
                content += "\n"
            path.parent.mkdir(parents=True, exist_ok=True)
            if i + 1 < len(lines) and lines[i + 1].startswith("SymlinkTo: "):
                path.symlink_to(lines[i + 1][11:])
            else:
                path.write_text(content)
        i += 1
