"""node_exporter on the agent's tree, scraped as Prometheus scrapes it, while the agent
runs beside it: the CPU each costs is read over the same seconds, so the ratio of the
two does not move with the machine's speed from one window to the next (on the bench VM
node_exporter's scrape of the same tree took 4.3 ms in one window and 7.2 ms in the next,
the agent's sample 3.2-3.7 ms).

`NodeExporter.mark()` reads its CPU and scrapes so far; two marks around an agent's
window give its cost per scrape in that window. Its system calls are counted in a window
of their own (strace slows what it traces), with nothing measured beside them.
"""

from __future__ import annotations

import http.client
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import syscalls

# What Prometheus 2.x sends with each scrape (scrape/scrape.go): node_exporter answers it
# with gzip, as it does in every deployment.
PROMETHEUS_SCRAPE_HEADERS = {
    "Accept": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
              "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "Accept-Encoding": "gzip",
    "X-Prometheus-Scrape-Timeout-Seconds": "10",
}
# The collectors that read what the agent reads of the bench's tree.
COLLECTORS = ("infiniband", "netdev", "diskstats", "meminfo", "stat", "loadavg")


def binary() -> str | None:
    return shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")


def proc_cpu_s(pid: int) -> float:
    """CPU time of every thread of `pid`, in nanoseconds' precision (schedstat): /proc's
    utime and stime count 10 ms ticks, too coarse for a few ms a scrape. Go keeps its
    threads, so none of the time is lost with an exiting one."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            total += int(Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return total / 1e9


@dataclass(frozen=True)
class Mark:
    cpu_s: float
    scrapes: int
    rchar: int
    syscr: int


class NodeExporter:
    """One node_exporter on `tree`, scraped every `every` seconds by a thread of this
    process (one kept-alive connection, as Prometheus keeps it) from `start()` to
    `stop()`."""

    def __init__(self, tree: Path, every: float) -> None:
        self.tree, self.every = tree, every
        self._proc: subprocess.Popen[bytes] | None = None
        self._conn: http.client.HTTPConnection | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()  # a scrape and its count, or a mark, at a time
        self._scrapes = 0
        self._failed: BaseException | None = None  # what ended the scraper thread

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    def start(self) -> NodeExporter:
        """Start it and wait until it answers; stopped again if it does not."""
        path = binary()
        if path is None:
            raise FileNotFoundError("node_exporter")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self._proc = subprocess.Popen(
            [path, f"--path.sysfs={self.tree / 'sys'}", f"--path.procfs={self.tree / 'proc'}",
             "--collector.disable-defaults", *(f"--collector.{c}" for c in COLLECTORS),
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(100):
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read()
                    break
                except OSError:
                    time.sleep(0.1)
            else:
                raise RuntimeError(f"node_exporter did not answer on port {port} in 10 s")
            self._conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            for _ in range(3):  # warm up
                self._scrape()
        except BaseException:
            self.stop()
            raise
        return self

    def _scrape(self) -> None:
        assert self._conn is not None
        self._conn.request("GET", "/metrics", headers=PROMETHEUS_SCRAPE_HEADERS)
        self._conn.getresponse().read()

    def scraping(self) -> None:
        """Scrape at the cadence (the first at once) on a thread of its own until
        `quiet()`."""
        self._stop.clear()

        def run() -> None:
            next_at = time.monotonic()
            try:
                while not self._stop.is_set():
                    with self._lock:  # a mark falls between two scrapes, not in one
                        self._scrape()
                        self._scrapes += 1
                    next_at += self.every
                    self._stop.wait(max(0.0, next_at - time.monotonic()))
            except Exception as exc:  # said at the next mark: no figure without scrapes
                self._failed = exc

        self._thread = threading.Thread(target=run, name="node_exporter scraper", daemon=True)
        self._thread.start()

    def quiet(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
            if self._thread.is_alive():
                raise RuntimeError("node_exporter's scraper did not stop in 10 s")
            self._thread = None

    def mark(self) -> Mark:
        if self._failed is not None:
            raise RuntimeError(f"scraping node_exporter failed: {self._failed!r}")
        with self._lock:
            io = syscalls.read_io(self.pid)
            return Mark(proc_cpu_s(self.pid), self._scrapes, io["rchar"], io["syscr"])

    @staticmethod
    def between(a: Mark, b: Mark) -> dict[str, Any]:
        """Its cost per scrape from mark `a` to mark `b`."""
        n = b.scrapes - a.scrapes
        if n < 1:
            raise RuntimeError("node_exporter was not scraped between the two marks")
        return {"cpu_ms_per_scrape": 1000 * (b.cpu_s - a.cpu_s) / n, "scrapes": n,
                "bytes_read_per_scrape": (b.rchar - a.rchar) / n,
                "read_calls_per_scrape": (b.syscr - a.syscr) / n}

    def _during(self, seconds: float) -> int:
        """Scraped for `seconds` here (the scraper stopped before and after); returns
        the scrapes."""
        before = self._scrapes
        self.scraping()
        time.sleep(seconds)
        self.quiet()
        if self._failed is not None:
            raise RuntimeError(f"scraping node_exporter failed: {self._failed!r}")
        return self._scrapes - before

    def alone(self, seconds: float) -> dict[str, Any]:
        """Its cost per scrape over `seconds` with nothing measured beside it."""
        a = self.mark()
        self._during(seconds)
        return self.between(a, self.mark())

    def syscalls(self, seconds: float) -> dict[str, Any]:
        """Its system calls per scrape, in a window of their own."""
        if seconds <= 0 or not syscalls.strace_available():
            return {}
        counted = syscalls.count_syscalls(self.pid, lambda: self._during(seconds))
        if isinstance(counted, syscalls.SyscallCount):
            return {"syscalls": counted.calls, "syscall_samples": counted.samples}
        return {"syscalls": counted}

    def stop(self) -> None:
        try:
            self.quiet()
        finally:
            if self._conn is not None:
                self._conn.close()
            if self._proc is not None:
                self._proc.terminate()
                try:
                    self._proc.wait(10)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait(10)
