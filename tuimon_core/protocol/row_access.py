"""A message's rows, typed: where a sample's or a hello's untyped containers (`gpus`,
`extra["fabric"]`, `extra["storage"]`) hand a reader its rows, as the TypedDicts of
rows.py, so that a key the reader misspells is a type error (mypy). Each returns what the
readers took before, by the same lookups; the cast is for the type checker only, no
copy. No sample (a node not heard from yet) reads as one without the section."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from tuimon_core.protocol.rows import DiskRow, FsRow, GpuRow, HostRow, PortInfoRow, PortRow

if TYPE_CHECKING:
    from tuimon_core.protocol.messages import Hello, Sample

__all__ = ["disk_rows", "filesystem_rows", "gpu_rows", "host_row", "port_info_rows",
           "port_rows"]


def gpu_rows(sample: Sample | None) -> list[GpuRow]:
    """A sample's GPUs, in inventory order ([] where it has none)."""
    return cast("list[GpuRow]", sample.gpus or []) if sample is not None else []


def host_row(sample: Sample | None) -> HostRow:
    """A sample's host values ({} where it has none)."""
    return cast("HostRow", sample.host or {}) if sample is not None else {}


def port_rows(sample: Sample | None) -> list[PortRow]:
    """A sample's fabric ports (`fabric.ports`; [] where it has none)."""
    if sample is None:
        return []
    return cast("list[PortRow]", (sample.extra.get("fabric") or {}).get("ports") or [])


def filesystem_rows(sample: Sample | None) -> list[FsRow]:
    """A sample's file systems (`storage.filesystems`; [] where it has none)."""
    if sample is None:
        return []
    return cast("list[FsRow]", (sample.extra.get("storage") or {}).get("filesystems") or [])


def disk_rows(sample: Sample | None) -> list[DiskRow]:
    """A sample's disks (`storage.disks`; [] where it has none)."""
    if sample is None:
        return []
    return cast("list[DiskRow]", (sample.extra.get("storage") or {}).get("disks") or [])


def port_info_rows(hello: Hello | None) -> list[PortInfoRow]:
    """A hello's fabric ports, their static facts (`ports`; [] where it has none)."""
    return cast("list[PortInfoRow]", hello.extra.get("ports") or []) if hello is not None \
        else []
