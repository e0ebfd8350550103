"""Writes tuimon_core/protocol/rows.py, the typed rows, from the name table:

    python -m tuimon_core.protocol.rows_gen

tests/test_rows.py fails while the file written differs from what this writes now (a
field added to the table, and the rows not written again)."""

from __future__ import annotations

import keyword
import sys
from pathlib import Path

from tuimon_core.protocol import fields as f
from tuimon_core.protocol.schema import AnyOf, Bin, Int, ListOf, MapOf, Num, Record, Str, WireType

OUT = Path(__file__).with_name("rows.py")

# Row type -> the fields it holds (their keys, as the decoder keeps them).
ROWS: tuple[tuple[str, str, tuple[f.Field, ...]], ...] = (
    ("GpuRow", "one GPU of a sample (`gpus`)", f.GPU_FIELDS),
    ("MigRow", "one MIG instance of a GPU (`mig`)", f.MIG_FIELDS),
    ("HostRow", "a sample's `host`", f.HOST_FIELDS),
    ("PortRow", "one fabric port of a sample (`fabric.ports`)", f.PORT_FIELDS),
    ("NicRow", "one NIC of a sample (`fabric.nics`)", f.NIC_FIELDS),
    ("FsRow", "one file system of a sample (`storage.filesystems`)", f.FS_FIELDS),
    ("DiskRow", "one disk of a sample (`storage.disks`)", f.DISK_FIELDS),
    ("GpuInfoRow", "one GPU of a hello (`gpus`)", f.GPU_INFO_FIELDS),
    ("PortInfoRow", "one port of a hello (`ports`)", f.PORT_INFO_FIELDS),
    ("ProcessRow", "one process on a GPU or MIG instance (`processes`)", f.PROCESS_FIELDS),
    ("PcieHopRow", "one link of a PCIe path (`pcie_path`)", f.PCIE_HOP_FIELDS),
)


def python_type(t: WireType) -> str:
    if isinstance(t, Int):
        return "int"
    if isinstance(t, Num):
        return "float"
    if isinstance(t, Str):
        return "str"
    if isinstance(t, Bin):
        return "bytes"
    if isinstance(t, ListOf):
        return f"list[{python_type(t.item)}]"
    if isinstance(t, MapOf):
        return "dict[str, Any]"
    if isinstance(t, Record):  # a row of its own where the table has one (a GPU's `mig`)
        return next((name for name, _, table in ROWS if t.fields == table), "dict[str, Any]")
    if isinstance(t, AnyOf):
        return " | ".join(dict.fromkeys(python_type(x) for x in t.types))
    return "Any"


def source() -> str:
    out = ['"""Typed rows of the wire, one TypedDict per kind of row, written from the name',
           "table (tuimon_core/protocol/fields.py) by tuimon_core/protocol/rows_gen.py: do",
           "not edit. For the type checker only: at run time a row is the dict the decoder",
           "made, so a misspelt key is caught by mypy at no cost. Every key may be absent,",
           'and any but a required one nil (could not be read)."""',
           "",
           "from __future__ import annotations",
           "",
           "from typing import Any, TypedDict",
           "",
           "__all__ = ["]
    out += [f'    "{name}",' for name, _, _ in sorted(ROWS)]
    out.append("]")
    for name, doc, table in ROWS:
        out += ["", "", f"# {doc[0].upper()}{doc[1:]}."]
        kinds = [(field.key, python_type(field.type) if field.required
                  else python_type(field.type) + " | None") for field in table]
        if any(keyword.iskeyword(key) for key, _ in kinds):  # a disk's `await`
            out.append(f'{name} = TypedDict("{name}", {{  # a keyword key: the functional form')
            out += [f'    "{key}": {kind},' for key, kind in kinds]
            out.append("}, total=False)")
        else:
            out.append(f"class {name}(TypedDict, total=False):")
            out += [f"    {key}: {kind}" for key, kind in kinds]
    return "\n".join(out) + "\n"


def main() -> int:
    OUT.write_text(source())
    print(OUT, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
