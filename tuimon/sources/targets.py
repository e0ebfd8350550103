"""Target lists: `host[:port]`, Slurm-style host lists, and targets files."""

from __future__ import annotations

from pathlib import Path

import hostlist

from agent.node import DEFAULT_PORT

MAX_TARGETS = 100_000


class TargetError(ValueError):
    """A target that cannot be parsed; the message names it."""


def expand_hostlist(text: str) -> list[str]:
    """`gpu[001-003,007]` -> gpu001 gpu002 gpu003 gpu007, by Slurm's rules (python-hostlist)."""
    try:
        names = hostlist.expand_hostlist(text)
    except hostlist.BadHostlist as exc:
        raise TargetError(f"bad host list {text!r}: {exc}") from None
    if len(names) > MAX_TARGETS:
        raise TargetError(f"host list {text!r} expands to {len(names)} hosts (limit "
                          f"{MAX_TARGETS})")
    return names


def parse_targets(items: list[str], default_port: int = DEFAULT_PORT) -> list[str]:
    """Expand host lists and give every target a port: `host:port` strings."""
    out: list[str] = []
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
            out.append(f"[{host}]:{port}")  # an IPv6 literal, not a host list
            continue
        elif ":" in item and "]" not in item.rsplit(":", 1)[1]:
            host, p = item.rsplit(":", 1)
            port = _port(p, item)
        for name in expand_hostlist(host):
            out.append(f"{name}:{port}")
    seen: set[str] = set()
    return [t for t in out if not (t in seen or seen.add(t))]


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
