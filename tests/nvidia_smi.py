"""Real servers' `nvidia-smi -q` (and `-a`, the same text) and `nvidia-smi -q -x` reports
read into what NVML would answer (FakeGpu values), for the tests that hold the rules
against real machines (tests/fixtures/real/nvidia_smi/). Only the fields the rules read:
name, utilization, SM clock and its maximum, temperature, power draw and limit, clock
event reasons, MIG mode, PCIe throughput."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from agent.sim.fake_nvml import FakeGpu

# nvidia-smi's names of the clock event reasons -> NVML's bits (nvmlClocksEventReason*).
REASON_BITS = {"Idle": 0x1, "Applications Clocks Setting": 0x2, "SW Power Cap": 0x4,
               "HW Slowdown": 0x8, "Sync Boost": 0x10, "SW Thermal Slowdown": 0x20,
               "HW Thermal Slowdown": 0x40, "HW Power Brake Slowdown": 0x80,
               "Display Clock Setting": 0x100}
XML_REASONS = {"clocks_event_reason_gpu_idle": 0x1,
               "clocks_event_reason_applications_clocks_setting": 0x2,
               "clocks_event_reason_sw_power_cap": 0x4, "clocks_event_reason_hw_slowdown": 0x8,
               "clocks_event_reason_sync_boost": 0x10,
               "clocks_event_reason_sw_thermal_slowdown": 0x20,
               "clocks_event_reason_hw_thermal_slowdown": 0x40,
               "clocks_event_reason_hw_power_brake_slowdown": 0x80,
               "clocks_event_reason_display_clocks_setting": 0x100}
_LINE = re.compile(r"^( *)(.+?)\s*:\s*(.*)$")
_NUMBER = re.compile(r"^(-?[0-9.]+)")


def _number(text: str) -> float | None:
    m = _NUMBER.match(text.strip())
    return float(m.group(1)) if m else None


def read_query(path: Path) -> list[dict[str, Any]]:
    """Each GPU of a `nvidia-smi -q` report: its values by section path
    (`Clocks/SM` -> `1980 MHz`), in the report's order."""
    gpus: list[dict[str, Any]] = []
    stack: list[tuple[int, str]] = []
    for raw in path.read_text().splitlines():
        if raw.startswith("GPU 0000"):
            gpus.append({"bus_id": raw.split()[1]})
            stack = []
            continue
        if not gpus or not raw.strip():
            continue
        indent = len(raw) - len(raw.lstrip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        m = _LINE.match(raw)
        if m is None:  # a section heading
            stack.append((indent, raw.strip()))
            continue
        key = "/".join([*(s for _, s in stack), m.group(2).strip()])
        gpus[-1].setdefault(key, m.group(3).strip())
    return gpus


def fake_gpus(path: Path) -> list[FakeGpu]:
    """The GPUs of a real `nvidia-smi -q` report as the fake NVML answers them."""
    out = []
    for i, g in enumerate(read_query(path)):
        reasons = 0
        for section in ("Clocks Event Reasons", "Clocks Throttle Reasons"):
            for name, bit in REASON_BITS.items():
                for key in (f"{section}/{name}", f"{section}/HW Slowdown/{name}"):
                    if g.get(key) == "Active":
                        reasons |= bit
        power = "GPU Power Readings" if "GPU Power Readings/Power Draw" in g else \
            "Power Readings"
        util = _number(g.get("Utilization/Gpu", ""))
        out.append(FakeGpu(
            i, name=g["Product Name"], util_gpu=int(util) if util is not None else 0,
            temp=int(_number(g.get("Temperature/GPU Current Temp", "")) or 0),
            power_mw=int((_number(g.get(f"{power}/Power Draw", "")) or 0) * 1000),
            power_limit_mw=int((_number(g.get(f"{power}/Current Power Limit", "")) or 0)
                               * 1000),
            sm_mhz=int(_number(g.get("Clocks/SM", "")) or 0),
            max_sm_mhz=int(_number(g.get("Max Clocks/SM", "")) or 0),
            clock_events=reasons))
    return out


def read_xml(path: Path) -> list[dict[str, Any]]:
    """Each GPU of a `nvidia-smi -q -x` report: the values the rules read."""
    out = []
    for gpu in ET.parse(path).getroot().iter("gpu"):
        def text(where: str, gpu: ET.Element = gpu) -> str:
            node = gpu.find(where)
            return (node.text or "").strip() if node is not None else ""
        reasons = 0
        for tag, bit in XML_REASONS.items():
            if text(f"clocks_event_reasons/{tag}") == "Active":
                reasons |= bit
        out.append({"name": text("product_name"), "mig": text("mig_mode/current_mig"),
                    "util": text("utilization/gpu_util"),
                    "power": _number(text("gpu_power_readings/power_draw")
                                     or text("power_readings/power_draw")),
                    "power_limit": _number(text("gpu_power_readings/current_power_limit")
                                           or text("power_readings/power_limit")),
                    "sm": _number(text("clocks/sm_clock")),
                    "max_sm": _number(text("max_clocks/sm_clock")),
                    "tx_kbs": _number(text("pci/tx_util")), "rx_kbs": _number(text("pci/rx_util")),
                    "reasons": reasons,
                    "instances": len(gpu.findall("mig_devices/mig_device"))})
    return out
