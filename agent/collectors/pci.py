"""The PCI bus, as sysfs shows it (no root needed): a device's link (generation and
width, now and at most), and the NVIDIA GPUs on the bus that NVML should see.

sysfs writes a link speed as `pci_speed_string()` does in the kernel's
drivers/pci/probe.c: `"16.0 GT/s PCIe"`; kernels up to 5.6 wrote `"16 GT/s"`, and
either may say `Unknown` (or fail the read with EINVAL when the capability cannot be
read): both are read, the last as "not known". Widths are lane counts (`"16"`).
"""

from __future__ import annotations

import re

from agent.files import FileTree, ReadError
from tuimon_core.link_rules import bus_address

PCI = "sys/bus/pci/devices"
NVIDIA = "0x10de"
# VGA and 3D controllers: the GPUs. Not bridges (0x0604) and not NVSwitches (0x0680).
GPU_CLASSES = ("0x0300", "0x0302")
# Drivers that take a GPU away from the node on purpose (passed through to a VM).
NOT_THE_NODES = frozenset({"vfio-pci", "pci-stub"})
# GT/s per lane -> PCIe generation.
GENERATIONS = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}
_SPEED = re.compile(r"^\s*([0-9.]+)\s*GT/s")


def generation(speed: str) -> int | None:
    """`"32.0 GT/s PCIe"` (or `"32 GT/s"`) -> 5; `Unknown` or anything else -> None."""
    m = _SPEED.match(speed)
    if m is None:
        return None
    try:
        return GENERATIONS.get(float(m.group(1)))
    except ValueError:
        return None


def lanes(width: str) -> int | None:
    text = width.strip().lstrip("x")
    return int(text) if text.isdigit() and 0 < int(text) <= 64 else None


def link(files: FileTree, device: str) -> dict[str, int | None]:
    """A device directory's PCIe link: `pcie_gen`, `pcie_width` (now) and their maxima.
    What cannot be read is None."""
    def read(name: str) -> str:
        try:
            return files.read_text(f"{device}/{name}")
        except ReadError:
            return ""
    return {"pcie_gen": generation(read("current_link_speed")),
            "pcie_width": lanes(read("current_link_width")),
            "pcie_gen_max": generation(read("max_link_speed")),
            "pcie_width_max": lanes(read("max_link_width"))}


def nvidia_gpus(files: FileTree) -> list[str]:
    """The NVIDIA GPUs on the bus that belong to this node (held by a driver other than
    one that passes them to VMs, or by none: a GPU the driver failed to take is the
    node's and missing), by address."""
    out = []
    try:
        devices = files.listdir(PCI)
    except ReadError:
        return []
    for address in devices:
        base = f"{PCI}/{address}"
        try:
            if files.read_text(f"{base}/vendor").strip().lower() != NVIDIA:
                continue
            if not files.read_text(f"{base}/class").strip().lower().startswith(GPU_CLASSES):
                continue
        except ReadError:
            continue
        if files.link_name(f"{base}/driver") in NOT_THE_NODES:
            continue
        normal = bus_address(address)
        if normal is not None:
            out.append(normal)
    return out
