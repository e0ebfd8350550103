"""What changed between two hellos, in words: the `inventory_changed` event says which
GPU, port or file system came, went or changed what ("GPU 3 NVLinks 18 -> 16; port
mlx5_1:1 gone"), not only how many there are now."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tuimon_core.protocol import Hello

# Past this many items the rest is counted, not listed: one event stays one line.
MAX_SAID = 6
# Fields of a port or GPU said when they change; the rest (a PCIe path's every hop, a
# board id) changes only with the device, which is said as gone and new.
# Each with the word it is said by.
GPU_FIELDS = {"nvlinks": "NVLinks", "nvlinks_total": "NVLinks in all",
              "pcie_gen_max": "PCIe gen", "pcie_width_max": "PCIe width", "vbios": "VBIOS",
              "name": "model"}
PORT_FIELDS = {"up": "up", "rate_text": "rate", "link_layer": "link layer",
               "fw_ver": "firmware", "pcie_gen": "PCIe gen", "pcie_width": "PCIe width",
               "netdev": "netdev"}
FS_FIELDS = {"fstype": "type", "source": "source"}


def _changes(kind: str, old: Mapping[str, Mapping[str, Any]],
             new: Mapping[str, Mapping[str, Any]], watched: Mapping[str, str]) -> list[str]:
    out = [f"{kind} {key} new" for key in new if key not in old]
    out += [f"{kind} {key} gone" for key in old if key not in new]
    for key in new:
        if key in old:
            moved = [f"{word} {old[key].get(name)} -> {new[key].get(name)}"
                     for name, word in watched.items()
                     if old[key].get(name) != new[key].get(name)]
            if moved:
                out.append(f"{kind} {key} " + ", ".join(moved))
    return out


def inventory_change(old: Hello | None, new: Hello) -> str:
    """`GPU 3 NVLinks 18 -> 16; port mlx5_1:1 gone`; or the counts when there is no
    earlier hello to compare with."""
    if old is None:
        return (f"{len(new.gpus)} GPU(s), {len(new.extra.get('ports') or [])} fabric "
                f"port(s), {len(new.extra.get('filesystems') or [])} file system(s)")

    def by_id(hello: Hello, family: str) -> dict[str, Mapping[str, Any]]:
        return {str(item.get("id")): item for item in hello.extra.get(family) or []
                if isinstance(item, Mapping)}

    said = _changes("GPU", {str(g.index): g.to_wire() for g in old.gpus},
                    {str(g.index): g.to_wire() for g in new.gpus}, GPU_FIELDS)
    said += _changes("port", by_id(old, "ports"), by_id(new, "ports"), PORT_FIELDS)
    said += _changes("file system", by_id(old, "filesystems"), by_id(new, "filesystems"),
                     FS_FIELDS)
    if not said:
        return "no GPU, port or file system changed (another part of the hello did)"
    more = len(said) - MAX_SAID
    return "; ".join(said[:MAX_SAID]) + (f"; and {more} more" if more > 0 else "")
