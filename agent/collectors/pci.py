"""The PCI bus, as sysfs shows it (no root needed): a device's link (generation and
width, now and at most), the path of links from a device up to its root port, and the
NVIDIA GPUs on the bus that NVML should see.

sysfs writes a link speed as `pci_speed_string()` does in the kernel's
drivers/pci/probe.c: `"16.0 GT/s PCIe"`; kernels up to 5.6 wrote `"16 GT/s"`, and
either may say `Unknown` (or fail the read with EINVAL when the capability cannot be
read): both are read, the last as "not known". Widths are lane counts (`"16"`).

The path: /sys/bus/pci/devices/<address> is a symlink into /sys/devices, where each
device's directory sits in its upstream bridge's, under the root bus's
(`pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:01.0/0000:19:00.0`). Counted from the
root bus, the bridges alternate: a root port (depth 1) faces down, a switch's upstream
port (2) faces up, its downstream ports (3) down, and so on. A link joins a
downward-facing port to the device below it (odd depth to even); an upstream port and
its downstream ports are joined inside the switch, by no link. Each link is read at both
ends (`max_link_speed`/`width`: what each end supports) and now (`current_link_*`, one
end: both ends of a link report the same state). What cannot be read is None: the
link is "unknown", never a guess.
"""

from __future__ import annotations

import posixpath
import re
from typing import Any

from agent.files import FileTree, ReadError
from tuimon_core.link_rules import GT_PER_LANE, bus_address

PCI = "sys/bus/pci/devices"
NVIDIA = "0x10de"
# VGA and 3D controllers: the GPUs. Not bridges (0x0604) and not NVSwitches (0x0680).
GPU_CLASSES = ("0x0300", "0x0302")
# Drivers that take a GPU away from the node on purpose (passed through to a VM).
NOT_THE_NODES = frozenset({"vfio-pci", "pci-stub"})
# GT/s per lane -> PCIe generation.
GENERATIONS = {rate: gen for gen, rate in enumerate(GT_PER_LANE, start=1)}
_SPEED = re.compile(r"^\s*([0-9.]+)\s*GT/s")
DEVICES = "sys/devices"
_ROOT_BUS = re.compile(r"pci[0-9a-f]{4,8}:[0-9a-f]{2}")
_ADDRESS = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
# Deeper than any real hierarchy (a root port, two levels of switches, a device: 6): a
# longer path is not believed.
MAX_PATH_DEPTH = 16


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


def _read(files: FileTree, rel: str, often: bool = False) -> str:
    """A sysfs file's text, "" when it cannot be read; `often`: through a kept descriptor
    (a link's state, read every sample)."""
    try:
        raw = files.read_counter(rel) if often else files.read_text(rel)
    except ReadError:
        return ""
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw


def _now(files: FileTree, device: str, often: bool = False) -> tuple[int | None, int | None]:
    """A device directory's link now: (generation, width)."""
    return (generation(_read(files, f"{device}/current_link_speed", often)),
            lanes(_read(files, f"{device}/current_link_width", often)))


def _most(files: FileTree, device: str) -> tuple[int | None, int | None]:
    """What a device directory's end of its link supports: (generation, width)."""
    return (generation(_read(files, f"{device}/max_link_speed")),
            lanes(_read(files, f"{device}/max_link_width")))


def link(files: FileTree, device: str) -> dict[str, int | None]:
    """A device directory's PCIe link: `pcie_gen`, `pcie_width` (now) and their maxima.
    What cannot be read is None."""
    (gen, width), (gen_max, width_max) = _now(files, device), _most(files, device)
    return {"pcie_gen": gen, "pcie_width": width, "pcie_gen_max": gen_max,
            "pcie_width_max": width_max}


def device_dirs(files: FileTree, address: str) -> list[str] | None:
    """The sysfs directories from the device's root port down to the device itself (the
    device last), from where /sys/bus/pci/devices/<address> points; None where that is
    not a path of PCI devices under a root bus (not a symlink, a target outside
    /sys/devices, a name that is not an address, deeper than MAX_PATH_DEPTH)."""
    target = files.link_target(f"{PCI}/{address}")
    if not target:
        return None
    where = posixpath.normpath(target.lstrip("/") if target.startswith("/")
                               else posixpath.join(PCI, target))
    parts = where.split("/")
    if parts[:2] != DEVICES.split("/"):
        return None
    # The last root bus: a VMD domain's (pci10000:00) sits inside another's device.
    top = max((i for i, name in enumerate(parts) if _ROOT_BUS.fullmatch(name)), default=None)
    if top is None:
        return None
    chain = parts[top + 1:]
    if not chain or len(chain) > MAX_PATH_DEPTH or chain[-1] != address or \
            not all(_ADDRESS.fullmatch(name) for name in chain):
        return None
    return ["/".join(parts[:top + 2 + i]) for i in range(len(chain))]


def _links(dirs: list[str]) -> list[tuple[str, str]]:
    """(upper end, lower end) of each link on a path from the root port down, the
    device's own first; none where the device has no link of its own (it sits on a root
    bus or inside a switch, at an odd depth)."""
    if len(dirs) % 2:
        return []
    return [(dirs[j], dirs[j + 1]) for j in range(len(dirs) - 2, -1, -2)]


class PciPaths:
    """The links from devices up to their root ports, by address: what each end supports
    is read rarely (`read`, with the inventory); the links' state now as often as the
    rules need it (`now`: through kept descriptors)."""

    def __init__(self, files: FileTree) -> None:
        self.files = files
        self._links: dict[str, list[tuple[str, str]]] = {}

    def read(self, address: str, *, with_now: bool = False) -> list[dict[str, Any]] | None:
        """The device's path as the wire's `pcie_path` (its own link first), None where
        it cannot be read; `with_now`: each link's state now too (`gen`, `width`)."""
        dirs = device_dirs(self.files, address)
        links = _links(dirs) if dirs is not None else []
        if not links:
            self._links.pop(address, None)
            return None
        self._links[address] = links
        hops = [self._hop(up, down, root=i == len(links) - 1)
                for i, (up, down) in enumerate(links)]
        if with_now:
            for hop, (up, down) in zip(hops, links):
                hop["gen"], hop["width"] = self._state(up, down)
        return hops

    def now(self, address: str) -> tuple[list[int | None], list[int | None]] | None:
        """Each link's generation and width now, in the order of `read`'s path; None
        where the path was not read."""
        links = self._links.get(address)
        if links is None:
            return None
        states = [self._state(up, down, often=True) for up, down in links]
        return [g for g, _ in states], [w for _, w in states]

    def _hop(self, up: str, down: str, *, root: bool) -> dict[str, Any]:
        (up_gen, up_width), (down_gen, down_width) = _most(self.files, up), \
            _most(self.files, down)
        return {"up": posixpath.basename(up), "down": posixpath.basename(down),
                "up_kind": "root" if root else "switch",
                "up_gen_max": up_gen, "up_width_max": up_width,
                "down_gen_max": down_gen, "down_width_max": down_width}

    def _state(self, up: str, down: str, often: bool = False) -> tuple[int | None, int | None]:
        """A link's state now, from its lower end, else its upper (the same link)."""
        gen, width = _now(self.files, down, often)
        if gen is None or width is None:
            up_gen, up_width = _now(self.files, up, often)
            gen, width = gen or up_gen, width or up_width
        return gen, width


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
