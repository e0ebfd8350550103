"""Host collector: CPU utilization, load, memory and uptime from /proc."""

from __future__ import annotations

import math
from typing import Any

from agent.files import FileTree, ReadError
from agent.rates import RateTracker

LOAD_PERIOD = 5.0  # the kernel's LOAD_FREQ
UPTIME_PERIOD = 60.0


class ParseError(ValueError):
    """A file's contents are not in the format the kernel writes."""


def parse_proc_stat(text: str) -> tuple[int, int, int]:
    """Return (busy jiffies, total jiffies, online CPUs) from /proc/stat."""
    busy = total = None
    cpus = 0
    for line in text.splitlines():
        if line.startswith("cpu "):
            parts = line.split()
            if not all(x.isascii() and x.isdigit() for x in parts[1:9]):
                raise ParseError(f"non-numeric cpu line: {line[:60]!r}")
            ticks = [int(x) for x in parts[1:9]]
            if len(ticks) < 4:
                raise ParseError(f"short cpu line: {line[:60]!r}")
            # user nice system idle iowait irq softirq steal; guest time is inside user.
            idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
            total = sum(ticks)
            busy = total - idle
        elif line.startswith("cpu") and line[3:4].isdigit():
            cpus += 1
    if busy is None or total is None:
        raise ParseError("no aggregate 'cpu' line")
    return busy, total, cpus


def _seconds_or_load(text: str) -> float:
    # float() also takes "nan", "inf", "1e400" and "-3"; the kernel writes none of them.
    value = float(text)
    if not (value >= 0 and math.isfinite(value)):
        raise ValueError(text)
    return value


def parse_loadavg(text: str) -> tuple[float, float, float]:
    parts = text.split()
    try:
        return (_seconds_or_load(parts[0]), _seconds_or_load(parts[1]),
                _seconds_or_load(parts[2]))
    except (IndexError, ValueError):
        raise ParseError(f"unexpected loadavg {text[:60]!r}") from None


MEMINFO_KEYS = frozenset({"MemTotal", "MemFree", "MemAvailable", "Buffers", "Cached"})


def parse_meminfo(text: str, keys: frozenset[str] = MEMINFO_KEYS) -> dict[str, int]:
    """Return the wanted meminfo values in bytes (the kernel writes kB = KiB)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name not in keys:
            continue
        fields = rest.split()
        if not fields:
            continue
        if not (fields[0].isascii() and fields[0].isdigit()):
            continue
        value = int(fields[0])
        if len(fields) > 1 and fields[1] == "kB":
            value *= 1024
        out[name.strip()] = value
    if "MemTotal" not in out:
        raise ParseError("no MemTotal line")
    return out


def parse_uptime(text: str) -> float:
    try:
        return _seconds_or_load(text.split()[0])
    except (IndexError, ValueError):
        raise ParseError(f"unexpected uptime {text[:60]!r}") from None


class HostCollector:
    """Reads the host's counters; CPU utilization comes from the /proc/stat delta."""

    def __init__(self, files: FileTree) -> None:
        self.files = files
        self._rates = RateTracker()
        self._load: tuple[float, float, float, float] | None = None
        self._uptime: tuple[float, float] | None = None
        # Files read, and how many failed, in the last collect().
        self.reads = 0
        self.failed_reads = 0

    def boot_id(self) -> str | None:
        try:
            return self.files.read_text("proc/sys/kernel/random/boot_id").strip() or None
        except ReadError:
            return None

    def collect(self, now: float) -> dict[str, Any]:
        """One reading; a field that fails is nil and its reason is in `errors`."""
        values: dict[str, Any] = {}
        errors: dict[str, str] = {}
        self.reads = self.failed_reads = 0

        def attempt(fields: tuple[str, ...], path: str, fn: Any) -> None:
            self.reads += 1
            try:
                fn(self.files.read_often(path))
            except (ReadError, ParseError) as exc:
                self.failed_reads += 1
                reason = f"{path}: {exc.reason if isinstance(exc, ReadError) else exc}"
                for f in fields:
                    values[f] = None
                    errors[f] = reason

        def stat(text: str) -> None:
            busy, total, cpus = parse_proc_stat(text)
            values["cpus"] = cpus or None
            d_busy = self._rates.rate("busy", busy, now)
            d_total = self._rates.rate("total", total, now)
            if d_busy is None or not d_total:
                values["cpu_util"] = None
            else:
                values["cpu_util"] = min(1.0, max(0.0, d_busy / d_total))

        def load(text: str) -> None:
            values["load1"], values["load5"], values["load15"] = parse_loadavg(text)

        def mem(text: str) -> None:
            info = parse_meminfo(text)
            total = info["MemTotal"]
            avail = info.get("MemAvailable")
            if avail is None:  # kernels before 3.14
                avail = info.get("MemFree", 0) + info.get("Buffers", 0) + info.get("Cached", 0)
            values["mem_total"] = total
            values["mem_available"] = avail
            values["mem_used"] = max(0, total - avail)

        def uptime(text: str) -> None:
            values["uptime"] = parse_uptime(text)

        attempt(("cpu_util", "cpus"), "proc/stat", stat)
        attempt(("mem_total", "mem_available", "mem_used"), "proc/meminfo", mem)
        # The kernel recomputes load averages every 5 s, and uptime only moves with the
        # clock: re-reading them every sample would cost two file reads for nothing.
        if self._load is None or now - self._load[0] >= LOAD_PERIOD:
            attempt(("load1", "load5", "load15"), "proc/loadavg", load)
            if values.get("load1") is not None:
                self._load = (now, values["load1"], values["load5"], values["load15"])
            else:
                self._load = None
        else:
            _, values["load1"], values["load5"], values["load15"] = self._load
        if self._uptime is None or now - self._uptime[0] >= UPTIME_PERIOD:
            attempt(("uptime",), "proc/uptime", uptime)
            self._uptime = (now, values["uptime"]) if values.get("uptime") is not None else None
        else:
            values["uptime"] = self._uptime[1] + (now - self._uptime[0])
        if errors:
            values["errors"] = errors
        return values
