"""What changed between two hellos, in words: the `inventory_changed` event says which
GPU, port, NIC or file system came, went or changed what ("GPU 3 (0000:3b:00.0) gone;
port mlx5_1:1 rate 400 Gb/sec -> 200 Gb/sec; GPUDirect nvidia_peermem -> none"), not
only how many there are now."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from tuimon_core.protocol import Hello
from tuimon_core.wording import plural

# Past this many items the rest is counted, not listed: one event stays one line.
MAX_SAID = 6
# Fields said with their values when they change, each with the word it is said by; a
# change in any other field (a PCIe path's hops, a board id) is named, not spelled out.
GPU_FIELDS = {"nvlinks": "NVLinks", "nvlinks_total": "NVLinks in all",
              "pcie_gen_max": "PCIe gen", "pcie_width_max": "PCIe width", "vbios": "VBIOS",
              "name": "model", "index": "index"}
PORT_FIELDS = {"up": "up", "rate_text": "rate", "link_layer": "link layer",
               "fw_ver": "firmware", "pcie_gen": "PCIe gen", "pcie_width": "PCIe width",
               "netdev": "netdev"}
NIC_FIELDS = {"speed": "speed"}
FS_FIELDS = {"fstype": "type", "source": "source"}


def _changes(kind: str, old: Mapping[str, Mapping[str, Any]],
             new: Mapping[str, Mapping[str, Any]], watched: Mapping[str, str],
             label: Callable[[str, Mapping[str, Any]], str] = lambda key, _: key
             ) -> list[str]:
    out = [f"{kind} {label(key, new[key])} new" for key in new if key not in old]
    out += [f"{kind} {label(key, old[key])} gone" for key in old if key not in new]
    for key in new:
        if key not in old or old[key] == new[key]:
            continue
        moved = [f"{word} {old[key].get(name)} -> {new[key].get(name)}"
                 for name, word in watched.items() if old[key].get(name) != new[key].get(name)]
        others = sorted(name for name in {*old[key], *new[key]} - set(watched)
                        if old[key].get(name) != new[key].get(name))
        if others:
            moved.append(f"{', '.join(others)} changed")
        out.append(f"{kind} {label(key, new[key])} " + ", ".join(moved))
    return out


def _gpus(hello: Hello) -> dict[str, Mapping[str, Any]]:
    # By what the GPU is (its bus id, else UUID), not NVML's index: indexes close up when
    # one leaves, so by index the last GPU would be said gone instead of the one that went.
    return {(g.pci_bus_id or g.uuid or str(g.index)): g.to_wire() for g in hello.gpus}


def _gpu_label(key: str, wire: Mapping[str, Any]) -> str:
    index = str(wire.get("index"))
    return index if key == index else f"{index} ({key})"


def _by_id(hello: Hello, family: str) -> dict[str, Mapping[str, Any]]:
    return {str(item.get("id")): item for item in hello.extra.get(family) or []
            if isinstance(item, Mapping)}


def _node_facts(hello: Hello) -> dict[str, Any]:
    return {"driver": hello.driver_version, "kernel": (hello.host or {}).get("kernel"),
            "GPUDirect": hello.extra.get("gpudirect") or "none",
            "GPUs on the PCI bus": len(hello.extra.get("pci_gpus") or [])}


def inventory_change(old: Hello | None, new: Hello) -> str:
    """`GPU 3 (0000:3b:00.0) NVLinks 18 -> 16; port mlx5_1:1 gone`; or the counts when
    there is no earlier hello to compare with."""
    if old is None:
        return (f"{plural(len(new.gpus), 'GPU')}, "
                f"{plural(len(new.extra.get('ports') or []), 'fabric port')}, "
                f"{plural(len(new.extra.get('filesystems') or []), 'file system')}")
    before, after = _node_facts(old), _node_facts(new)
    said = [f"{name} {before[name]} -> {after[name]}" for name in before
            if before[name] != after[name]]
    said += _changes("GPU", _gpus(old), _gpus(new), GPU_FIELDS, _gpu_label)
    said += _changes("port", _by_id(old, "ports"), _by_id(new, "ports"), PORT_FIELDS)
    said += _changes("NIC", _by_id(old, "nics"), _by_id(new, "nics"), NIC_FIELDS)
    said += _changes("file system", _by_id(old, "filesystems"), _by_id(new, "filesystems"),
                     FS_FIELDS)
    if not said:
        return "the node's description changed (no GPU, port, NIC or file system did)"
    more = len(said) - MAX_SAID
    return "; ".join(said[:MAX_SAID]) + (f"; and {more} more" if more > 0 else "")
