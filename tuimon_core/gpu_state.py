"""How a GPU stands: how busy it is, and whether it is throttled, judged by the effect
with the clock-event reasons as the explanation. The one place the node rules (a
finding), the link rules (judged while busy) and the health map (a degraded cell) read
them.

NVML's reason bits are not throttling by themselves: real H100s report `SW Thermal
Slowdown`, `SW Power Cap` and `HW Power Brake` at 39 °C, idle, with the SM clock at its
1980 MHz maximum; an idle A40 or A10 reports `SW Power Cap` at a tenth of its limit. So:

- a hardware slowdown (`hw_slowdown`, `hw_power_brake_slowdown`, `hw_thermal_slowdown`)
  that collapses the clock is a fault: NVML says these cut core clocks "by a factor of 2
  or more", so at or below half the GPU's maximum SM clock while it has work
  (critical), or below a tenth of it while idle (warning: below any idle clock; a real
  HGX H100 under power brake sat at 86 MHz of 1980 where its healthy peers idle at
  345);
- thermal or power throttling is the SM clock held below 90 % of its maximum while the
  GPU has work (busy 30 % or more): thermal (a warning), a power cap (information: a
  GPU that draws its whole power limit runs a little slower by design, as a real RTX
  4090 at 445 of 450 W does at 2640 of 3105 MHz);
- without the maximum (an older agent, a source that lacks it) the reasons count while
  the GPU has work, as before.

How busy: SM activity where DCGM profiling gives it, else utilization (`gpu_busy`); for
the rules, else (MIG, where NVML has no utilization) the instances' activity or the
power drawn (`gpu_work`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from tuimon_core.protocol.rows import GpuRow

# Where DCGM profiling gives it, SM activity says how busy a GPU is better than NVML's
# utilization (which counts a single running kernel as 100 %); in MIG mode it is all
# there is. The first present wins; views say which one they show.
BUSY_FIELDS: tuple[tuple[Literal["sm_active", "gr_active", "util"], str], ...] = (
    ("sm_active", "SM active"), ("gr_active", "engine active"), ("util", "util"))


def gpu_busy(v: GpuRow) -> tuple[float | None, str | None]:
    """How busy a GPU is (0..1) and what measured it."""
    for key, label in BUSY_FIELDS:
        value = v.get(key)
        if value is not None:
            return value, label
    return None, None


def xids_seen(total: int | None, last: int | None) -> int:
    """How many XIDs a GPU has seen: its agent's count, or one where a source gives only
    the last XID (dcgm-exporter through Prometheus), none where it gives neither."""
    return total or (1 if last else 0)


# Power drawn, as a share of the limit, that reads as idle and as fully busy: an idle
# H100 draws about a tenth of its 700 W, an idle A100 in MIG mode 67 of 400 W (a real
# capture), one at work half or more.
POWER_IDLE_SHARE = 0.25
POWER_BUSY_SHARE = 0.75


def gpu_work(v: GpuRow, info: Any = None) -> tuple[float | None, str | None]:
    """How busy a GPU is for the rules that judge it only while it has work (a link
    downtrained while busy, a clock held down): `gpu_busy`; else, in MIG mode where NVML
    has no utilization, the busiest instance's activity (DCGM profiling), else the power
    it draws between POWER_IDLE_SHARE (0) and POWER_BUSY_SHARE (1) of its limit."""
    busy = gpu_busy(v)
    if busy[0] is not None:
        return busy
    shown = [x for m in v.get("mig") or () for x in (m.get("sm_active"), m.get("gr_active"))
             if x is not None]
    if shown:
        return max(shown), "MIG instances active"
    power = v.get("power")
    limit = v.get("power_limit") or getattr(info, "power_limit", None)
    if isinstance(power, (int, float)) and limit:
        share = (power / limit - POWER_IDLE_SHARE) / (POWER_BUSY_SHARE - POWER_IDLE_SHARE)
        return min(1.0, max(0.0, share)), "power drawn"
    return None, None


THERMAL = frozenset({"hw_thermal_slowdown", "sw_thermal_slowdown"})
HW_SLOWDOWN = frozenset({"hw_slowdown", "hw_power_brake_slowdown", "hw_thermal_slowdown"})
POWER = frozenset({"sw_power_cap", "hw_slowdown", "hw_power_brake_slowdown"})
BUSY_WORK = 0.3  # a GPU this busy has work: a clock held down costs it
HELD_BELOW = 0.9  # of the maximum SM clock: throttled
COLLAPSED_BUSY = 0.5  # of the maximum: a hardware slowdown's "factor of 2 or more"
COLLAPSED_IDLE = 0.1  # below any idle clock (an H100 idles at 345 of 1980 MHz)


@dataclass(frozen=True, slots=True)
class Throttle:
    kind: str  # hw_slowdown | thermal | power
    severity: str
    reasons: tuple[str, ...]
    sm_clock: float | None  # Hz
    max_sm_clock: float | None
    busy: float | None

    def clocks(self) -> str:
        """`SM 86 of 1980 MHz`, or '' where not known."""
        if self.sm_clock is None:
            return ""
        top = f" of {self.max_sm_clock / 1e6:.0f}" if self.max_sm_clock else ""
        return f"SM {self.sm_clock / 1e6:.0f}{top} MHz"


def throttle(values: GpuRow, info: Any = None) -> Throttle | None:
    """The GPU's throttling as its effect shows it, or None (`info`: its GpuInfo, for
    the maximum SM clock)."""
    reasons = set(values.get("clock_events") or ()) & (THERMAL | HW_SLOWDOWN | POWER)
    if not reasons:
        return None
    sm = values.get("sm_clock")
    top = getattr(info, "max_sm_clock", None)
    ratio = sm / top if isinstance(sm, (int, float)) and top else None
    busy = gpu_work(values, info)[0]
    working = busy is not None and busy >= BUSY_WORK
    said = tuple(sorted(reasons))

    def found(kind: str, severity: str) -> Throttle:
        return Throttle(kind, severity, said, sm, top, busy)

    if reasons & HW_SLOWDOWN and ratio is not None:
        if working and ratio <= COLLAPSED_BUSY:
            return found("hw_slowdown", "critical")
        if not working and ratio < COLLAPSED_IDLE:
            return found("hw_slowdown", "warning")
    if not working or (ratio is not None and ratio >= HELD_BELOW):
        return None
    if reasons & THERMAL:
        return found("thermal", "warning")
    return found("power", "info")
