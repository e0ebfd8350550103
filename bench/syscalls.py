"""Counting a running process's system calls and bytes read, for the cost benchmarks.

CPU time on a shared two-core machine moves by half from hour to hour; the number of
system calls a program makes for one sample, and the bytes it reads, do not. Both are
read from outside the process being measured: `strace -c -f` attached to it for a window
(all of its threads), and /proc/PID/io (`rchar`, `syscr`: bytes and read calls of every
read, pread and recv). strace slows what it traces, so its window is kept apart from the
window CPU time is measured in.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

# The calls that read the machine's files (what the two programs do differently):
# opening, reading, listing and closing them, and the buffer and seek calls a buffered
# open adds. The others are the runtime's (futex, epoll, nanosleep, mmap) and the network.
FILE_CALLS = frozenset({
    "openat", "open", "read", "pread64", "readv", "close", "getdents64", "newfstatat",
    "fstat", "statx", "lseek", "ioctl", "readlink", "readlinkat", "faccessat", "faccessat2",
    "statfs", "fstatfs"})


@dataclass
class SyscallCount:
    """What strace counted over a window, and how many samples (or scrapes) it covered."""

    samples: int
    calls: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.calls.values())

    @property
    def file_calls(self) -> int:
        return sum(n for name, n in self.calls.items() if name in FILE_CALLS)

    def per_sample(self, calls: int) -> float:
        return calls / max(1, self.samples)

    def top(self, n: int = 8) -> list[tuple[str, float]]:
        ranked = sorted(self.calls.items(), key=lambda kv: -kv[1])[:n]
        return [(name, self.per_sample(count)) for name, count in ranked]


def strace_available() -> bool:
    return shutil.which("strace") is not None


def parse_summary(text: str) -> dict[str, int]:
    """`strace -c`'s table: calls by system call name (the `total` row left out)."""
    calls: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        # % time, seconds, usecs/call, calls, [errors], syscall
        if len(parts) >= 5 and parts[-1] != "total" and parts[3].isdigit():
            calls[parts[-1]] = int(parts[3])
    return calls


def count_syscalls(pid: int, during: Callable[[], int]) -> SyscallCount | str:
    """Attach strace to every thread of `pid`, run `during` (which returns how many
    samples or scrapes it saw), detach, and count; or say why it could not."""
    with tempfile.NamedTemporaryFile(prefix="tuimon-strace-", suffix=".txt",
                                     delete=False) as f:
        out = Path(f.name)
    proc = subprocess.Popen(["strace", "-c", "-f", "-o", str(out), "-p", str(pid)],
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()  # "strace: Process N attached..." once it is on
        if "attached" not in first:
            proc.wait(5)
            return f"strace could not attach: {first.strip() or proc.returncode}"
        samples = during()
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(10)
    try:
        return SyscallCount(samples, parse_summary(out.read_text()))
    finally:
        out.unlink(missing_ok=True)


def read_io(pid: int) -> dict[str, int]:
    """/proc/PID/io: `rchar` (bytes read) and `syscr` (read calls), among others."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        key, _, value = line.partition(":")
        if value.strip().isdigit():
            out[key] = int(value)
    return out
