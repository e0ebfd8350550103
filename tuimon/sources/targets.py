"""Target lists: `host[:port]`, Slurm-style host lists, and targets files."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import hostlist

from agent.node import DEFAULT_PORT

MAX_TARGETS = 100_000
# A host list is counted before it is expanded: `a[1-99999]b[1-99999]` is 20 bytes and
# ten billion names, and expanding first is what lets a small message stall a process.
MAX_HOSTLIST_CHARS = 65536


class TargetError(ValueError):
    """A target that cannot be parsed; the message names it."""


_GROUP = re.compile(r"\[([^\]]*)\]")
_RANGE = re.compile(r"([0-9]+)-([0-9]+)")


def hostlist_size(text: str, limit: int = MAX_TARGETS) -> int:
    """How many names a Slurm host list names (duplicates counted), without building any;
    raises TargetError as soon as the count passes `limit`."""
    if len(text) > MAX_HOSTLIST_CHARS:
        raise TargetError(f"host list of {len(text)} characters (limit {MAX_HOSTLIST_CHARS})")
    total = 0
    depth = 0
    start = 0
    for i, c in enumerate(text + ","):
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
        if depth > 1 or depth < 0:
            raise TargetError(f"bad host list {_short(text)}: nested or unbalanced brackets")
        if c == "," and depth == 0:
            total += _part_size(text[start:i], text)
            start = i + 1
            if total > limit:
                # `limit` is what is left of MAX_TARGETS when several lists share it.
                cap = f"{limit} hosts" if limit == MAX_TARGETS else \
                    f"{MAX_TARGETS} hosts with the lists before it"
                raise TargetError(f"host list {_short(text)} names more than {cap}")
    if depth:
        raise TargetError(f"bad host list {_short(text)}: unbalanced brackets")
    return total


def _part_size(part: str, whole: str) -> int:
    if not part:
        return 0
    size = 1
    for group in _GROUP.findall(part):
        n = 0
        for item in group.split(","):
            m = _RANGE.fullmatch(item)
            if m:
                n += max(0, int(m.group(2)) - int(m.group(1)) + 1)
            elif item.isdigit():
                n += 1
            else:
                raise TargetError(f"bad host list {_short(whole)}: bad range {item!r}")
        size *= n
        if size > MAX_TARGETS:
            return size  # the caller stops at its limit; no need to multiply further
    return size


def _short(text: str) -> str:
    return repr(text if len(text) <= 60 else text[:57] + "...")


def expand_hostlist(text: str, limit: int = MAX_TARGETS) -> list[str]:
    """`gpu[001-003,007]` -> gpu001 gpu002 gpu003 gpu007, by Slurm's rules (python-hostlist),
    counted first (at most `limit` names)."""
    hostlist_size(text, limit)
    try:
        return hostlist.expand_hostlist(text)
    except hostlist.BadHostlist as exc:
        raise TargetError(f"bad host list {_short(text)}: {exc}") from None


def expand_hostlists(items: Iterable[str], limit: int = MAX_TARGETS) -> list[str]:
    """Several host lists, at most `limit` names in all, counted before any is expanded."""
    items = list(items)
    total = 0
    for item in items:
        total += hostlist_size(item, limit - total)
    out: list[str] = []
    for item in items:
        out.extend(hostlist.expand_hostlist(item))
    return out


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
