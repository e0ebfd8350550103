"""Target lists: `host[:port]`, Slurm-style host lists, and targets files."""

from __future__ import annotations

import re
from pathlib import Path

from tuimon_core.hostlist import (
    MAX_TARGETS,
    TargetError,
    _short,
    expand_hostlist,
    expand_hostlists,
    hostlist_size,
)
from tuimon_core.ports import DEFAULT_PORT

__all__ = ["MAX_TARGETS", "TargetError", "expand_hostlist", "expand_hostlists",
           "hostlist_size", "parse_targets", "read_targets_file"]

_HOST = re.compile(r"[A-Za-z0-9._-]+")
_IPV6 = re.compile(r"[0-9A-Fa-f:.]+(%[A-Za-z0-9._-]+)?")


def parse_targets(items: list[str], default_port: int = DEFAULT_PORT) -> list[str]:
    """Expand host lists and give every target a port: `host:port` strings."""
    out: list[str] = []
    budget = MAX_TARGETS
    for item in items:
        item = item.strip()
        if not item or item.startswith("#"):
            continue
        host, port = item, default_port
        if item.startswith("["):
            end = item.find("]")
            if end < 0:
                raise TargetError(f"target {item!r}: unclosed '[' in an IPv6 address")
            host, rest = item[1:end], item[end + 1:]
            if rest.startswith(":"):
                port = _port(rest[1:], item)
            if not _IPV6.fullmatch(host):
                raise TargetError(f"target {_short(item)}: not an IPv6 address in brackets")
            out.append(f"[{host}]:{port}")  # an IPv6 literal, not a host list
            continue
        elif ":" in item and "]" not in item.rsplit(":", 1)[1]:
            host, p = item.rsplit(":", 1)
            port = _port(p, item)
        names = expand_hostlist(host, budget)
        budget -= len(names)
        for name in names:
            if not _HOST.fullmatch(name):
                raise TargetError(f"target {_short(item)}: {_short(name)} is not a host name "
                                  "(letters, digits, '.', '-' and '_' only)")
            out.append(f"{name}:{port}")
    return list(dict.fromkeys(out))  # drop repeats, keep the first order


def read_targets_file(path: str | Path) -> list[str]:
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise TargetError(f"targets file {path}: {exc.strerror or exc}") from None
    return [line.split("#", 1)[0].strip() for line in lines if line.split("#", 1)[0].strip()]


def _port(text: str, item: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise TargetError(f"bad port {text!r} in target {item!r}")
    return int(text)
