"""Parsers for storage statistics files: pure functions from text to numbers.

Each raises `FormatError` with a short reason on input that is not in the format the
kernel or the file system writes; the collectors turn that into a per-item reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field


class FormatError(ValueError):
    """Text that is not in the expected format."""


# -- Lustre llite stats -------------------------------------------------------------------

# Metadata operations, counted from llite stats (their sample counts).
LUSTRE_METADATA_OPS = frozenset({
    "open", "close", "getattr", "setattr", "statfs", "readdir", "create", "mkdir", "rmdir",
    "unlink", "rename", "link", "symlink", "mknod", "truncate", "fsync", "getxattr",
    "setxattr", "listxattr", "removexattr", "alloc_inode",
})


@dataclass
class LustreStats:
    read_bytes: int = 0
    write_bytes: int = 0
    reads: int = 0
    writes: int = 0
    metadata_ops: int = 0
    ops: dict[str, int] = field(default_factory=dict)


def _uint(text: str) -> int:
    """A counter as the kernel prints it: ASCII digits only. int() would also take "-5",
    "+5", "1_000" and other scripts' digits, none of which a counter file holds."""
    if not (text.isascii() and text.isdigit()):
        raise ValueError(f"not a counter: {text[:20]!r}")
    return int(text)


def parse_llite_stats(text: str) -> LustreStats:
    """`name count samples [unit] min max sum [sumsq]` lines of an llite `stats` file."""
    out = LustreStats()
    seen = False
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 3 or parts[2] != "samples":
            continue
        name = parts[0]
        try:
            count = _uint(parts[1])
        except ValueError:
            raise FormatError(f"bad count in llite stats line {line[:60]!r}") from None
        seen = True
        out.ops[name] = count
        if name in ("read_bytes", "write_bytes"):
            if len(parts) < 7:
                raise FormatError(f"{name} line has no sum: {line[:60]!r}")
            try:
                total = _uint(parts[6])
            except ValueError:
                raise FormatError(f"bad sum in {line[:60]!r}") from None
            if name == "read_bytes":
                out.read_bytes, out.reads = total, count
            else:
                out.write_bytes, out.writes = total, count
        elif name in LUSTRE_METADATA_OPS:
            out.metadata_ops += count
    if not seen and "snapshot_time" not in text:
        raise FormatError("no llite stats lines")
    return out


def lustre_source_fsname(source: str) -> str:
    """A Lustre mount's file system name from its source: `10.0.0.1@o2ib:/scratch` and
    the subdirectory mount `10.0.0.1@o2ib:/scratch/projects` are both `scratch`."""
    return source.rsplit(":/", 1)[-1].strip("/").split("/", 1)[0]


def lustre_fsname(instance: str) -> str:
    """`scratch-ffff88105db50000` -> `scratch` (the instance suffix is a kernel address)."""
    head, sep, tail = instance.rpartition("-")
    return head if sep and re.fullmatch(r"[0-9a-f]{8,16}", tail) else instance


# -- GPFS mmpmon ------------------------------------------------------------------------


@dataclass
class GpfsStats:
    filesystem: str
    cluster: str | None
    read_bytes: int
    write_bytes: int
    reads: int
    writes: int
    opens: int
    closes: int
    readdirs: int
    inode_updates: int


def parse_mmpmon_fs_io_s(text: str) -> list[GpfsStats]:
    """`mmpmon -p -s` answers to `fs_io_s`: one `_fs_io_s_ _key_ value ...` line per fs."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if not parts or parts[0] != "_fs_io_s_":
            continue
        kv = dict(zip(parts[1::2], parts[2::2]))
        if kv.get("_rc_", "0") != "0":
            raise FormatError(f"mmpmon returned rc {kv.get('_rc_')}")
        try:
            out.append(GpfsStats(
                filesystem=kv["_fs_"], cluster=kv.get("_cl_"),
                read_bytes=_uint(kv["_br_"]), write_bytes=_uint(kv["_bw_"]),
                reads=_uint(kv["_rdc_"]), writes=_uint(kv["_wc_"]),
                opens=_uint(kv["_oc_"]), closes=_uint(kv["_cc_"]),
                readdirs=_uint(kv.get("_dir_", "0")),
                inode_updates=_uint(kv.get("_iu_", "0"))))
        except KeyError as exc:
            raise FormatError(f"mmpmon line lacks {exc.args[0]}") from None
        except ValueError:
            raise FormatError(f"non-numeric value in mmpmon line {line[:60]!r}") from None
    return out


# -- NFS mountstats ------------------------------------------------------------------------

NFS_OPS_OF_INTEREST = ("READ", "WRITE", "GETATTR", "LOOKUP", "ACCESS", "OPEN", "CLOSE",
                       "COMMIT", "SETATTR", "READDIR", "READDIRPLUS", "CREATE", "REMOVE")


@dataclass
class NfsOp:
    ops: int
    execute_ms: int  # total execution time (queue + RTT), milliseconds


@dataclass
class NfsMount:
    device: str
    mountpoint: str
    fstype: str
    # bytes: normal read, normal write, direct read, direct write, server read, server write
    read_bytes: int = 0
    write_bytes: int = 0
    server_read_bytes: int = 0
    server_write_bytes: int = 0
    ops: dict[str, NfsOp] = field(default_factory=dict)


_DEVICE_RE = re.compile(r"^device (\S+) mounted on (\S+) with fstype (\S+)")


def parse_mountstats(text: str) -> list[NfsMount]:
    """NFS mounts in /proc/<pid>/mountstats; other file systems are skipped."""
    mounts: list[NfsMount] = []
    current: NfsMount | None = None
    in_ops = False
    for line in text.splitlines():
        m = _DEVICE_RE.match(line)
        if m:
            in_ops = False
            current = None
            if m.group(3).startswith("nfs"):
                current = NfsMount(m.group(1), _unescape(m.group(2)), m.group(3))
                mounts.append(current)
            continue
        if current is None:
            continue
        stripped = line.strip()
        if stripped.startswith("bytes:"):
            fields = stripped.split()[1:]
            if len(fields) < 6:
                raise FormatError(f"{current.mountpoint}: bytes line has {len(fields)} fields")
            try:
                n = [_uint(x) for x in fields[:6]]
            except ValueError:
                raise FormatError(f"{current.mountpoint}: non-numeric bytes line") from None
            current.read_bytes = n[0] + n[2]  # normal + direct
            current.write_bytes = n[1] + n[3]
            current.server_read_bytes, current.server_write_bytes = n[4], n[5]
        elif stripped == "per-op statistics":
            in_ops = True
        elif in_ops and ":" in stripped:
            name, _, rest = stripped.partition(":")
            fields = rest.split()
            if name in NFS_OPS_OF_INTEREST and len(fields) >= 8:
                try:
                    current.ops[name] = NfsOp(_uint(fields[0]), _uint(fields[7]))
                except ValueError:
                    raise FormatError(f"{current.mountpoint}: bad {name} line") from None
    return mounts


def _unescape(path: str) -> str:
    """Mount points escape spaces and tabs as octal (`\\040`)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), path)


# -- /proc/diskstats -------------------------------------------------------------------------


@dataclass
class DiskStats:
    name: str
    major: int
    minor: int
    reads: int
    read_sectors: int
    read_ms: int
    writes: int
    write_sectors: int
    write_ms: int
    io_ms: int


def parse_diskstats(text: str) -> list[DiskStats]:
    out = []
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if len(parts) < 14:
            raise FormatError(f"diskstats line with {len(parts)} fields: {line[:60]!r}")
        # Every counter ASCII digits (as _uint), tested once for the line's fields joined:
        # split() leaves no empty field, so the join is digits only when each field is.
        fields = parts[3:14]
        digits = "".join(fields) + parts[0] + parts[1]
        if not (digits.isascii() and digits.isdigit()):
            raise FormatError(f"non-numeric diskstats line: {line[:60]!r}")
        n = list(map(int, fields))
        out.append(DiskStats(parts[2], int(parts[0]), int(parts[1]), reads=n[0],
                             read_sectors=n[2], read_ms=n[3], writes=n[4],
                             write_sectors=n[6], write_ms=n[7], io_ms=n[9]))
    return out


_PARTITION_RE = re.compile(
    r"^(sd[a-z]+|vd[a-z]+|xvd[a-z]+|hd[a-z]+)\d+$|^(nvme\d+n\d+|mmcblk\d+)p\d+$")
_VIRTUAL_RE = re.compile(r"^(loop|ram|dm-|md|zram|nbd|sr|fd)\d*")


def disk_kind_from_name(name: str) -> str:
    """Fallback when /sys/block is not readable: `partition`, `virtual` or `disk`."""
    if _PARTITION_RE.match(name):
        return "partition"
    if _VIRTUAL_RE.match(name):
        return "virtual"
    return "disk"


# -- /proc/mounts --------------------------------------------------------------------------



@dataclass
class Mount:
    source: str
    mountpoint: str
    fstype: str


def parse_mounts(text: str) -> list[Mount]:
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        out.append(Mount(parts[0], _unescape(parts[1]), parts[2]))
    return out
