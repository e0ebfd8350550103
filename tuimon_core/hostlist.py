"""Slurm host lists (`gpu[001-128]`), counted before they are expanded.

Everywhere a host list is accepted (command line, config, topology.conf, a viewer's
subscribe) it goes through here: a 20-byte list can name ten billion hosts, and
expanding it first is what lets a small message stall a process.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import hostlist

from tuimon_core.errors import UsageError

MAX_TARGETS = 100_000
MAX_HOSTLIST_CHARS = 65536
# Characters of names one host list (or several together) may expand to: 100,000 names
# of 40 characters fit; a 20 KB prefix times 100,000 (2 GB) does not.
MAX_EXPANDED_CHARS = 4 << 20
# Digits of one range bound: a node number, not a 5,000-digit integer to convert.
MAX_RANGE_DIGITS = 12


class TargetError(UsageError, ValueError):
    """A target or host list that cannot be parsed; the message names it."""


_GROUP = re.compile(r"\[([^\]]*)\]")
_RANGE = re.compile(r"([0-9]+)-([0-9]+)")


def hostlist_size(text: str, limit: int = MAX_TARGETS,
                  chars_limit: int = MAX_EXPANDED_CHARS) -> int:
    """How many names a Slurm host list names (duplicates counted), without building any;
    raises TargetError as soon as the count passes `limit`, or the names would take more
    than `chars_limit` characters."""
    return _measure(text, limit, chars_limit)[0]


def _measure(text: str, limit: int, chars_limit: int) -> tuple[int, int]:
    """(names, characters of the names) of a host list, counted without building any."""
    if len(text) > MAX_HOSTLIST_CHARS:
        raise TargetError(f"host list of {len(text)} characters (limit {MAX_HOSTLIST_CHARS})")
    total = 0
    chars = 0
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
            size, longest = _part_size(text[start:i], text)
            total += size
            chars += size * longest
            start = i + 1
            if total > limit:
                # `limit` is what is left of MAX_TARGETS when several lists share it.
                cap = f"{limit} hosts" if limit == MAX_TARGETS else \
                    f"{MAX_TARGETS} hosts with the lists before it"
                raise TargetError(f"host list {_short(text)} names more than {cap}")
            if chars > chars_limit:
                raise TargetError(f"host list {_short(text)} names more than "
                                  f"{MAX_EXPANDED_CHARS >> 20} MiB of names")
    if depth:
        raise TargetError(f"bad host list {_short(text)}: unbalanced brackets")
    return total, chars


def _part_size(part: str, whole: str) -> tuple[int, int]:
    """(names, the longest name's length) of one comma-free part: the text outside its
    brackets plus, for each bracket, its widest number."""
    if not part:
        return 0, 0
    size = 1
    longest = len(_GROUP.sub("", part))
    for group in _GROUP.findall(part):
        n = 0
        width = 0
        for item in group.split(","):
            m = _RANGE.fullmatch(item)
            if m:
                low, high = m.group(1), m.group(2)
                if max(len(low), len(high)) > MAX_RANGE_DIGITS:
                    raise TargetError(f"bad host list {_short(whole)}: range {_short(item)} "
                                      f"has more than {MAX_RANGE_DIGITS} digits")
                if int(high) < int(low):
                    raise TargetError(f"bad host list {_short(whole)}: range {item!r} runs "
                                      "backwards")
                n += int(high) - int(low) + 1
                width = max(width, len(low), len(high))
            elif item.isdigit():
                if len(item) > MAX_RANGE_DIGITS:
                    raise TargetError(f"bad host list {_short(whole)}: number {_short(item)} "
                                      f"has more than {MAX_RANGE_DIGITS} digits")
                n += 1
                width = max(width, len(item))
            else:
                raise TargetError(f"bad host list {_short(whole)}: bad range {item!r}")
        size *= n
        longest += width
        if size > MAX_TARGETS:
            return size, longest  # the caller stops at its limit: no need to go on
    return size, longest


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
    """Several host lists, at most `limit` names and MAX_EXPANDED_CHARS characters of names
    in all, counted before any is expanded."""
    items = list(items)
    total = 0
    chars = 0
    for item in items:
        size, used = _measure(item, limit - total, MAX_EXPANDED_CHARS - chars)
        total += size
        chars += used
    out: list[str] = []
    for item in items:
        try:
            out.extend(hostlist.expand_hostlist(item))
        except hostlist.BadHostlist as exc:
            raise TargetError(f"bad host list {_short(item)}: {exc}") from None
    return out


def collect_hostlist(names: Iterable[str]) -> str:
    """`gpu001 gpu002 gpu003 gpu007` -> `gpu[001-003,007]` (python-hostlist)."""
    names = list(names)
    try:
        return str(hostlist.collect_hostlist(names))
    except Exception:  # an odd name the library cannot group: list them
        return ",".join(names)


def hostlist_within(names: Iterable[str], room: int) -> str:
    """The host list of `names` in at most `room` characters: whole where it fits, else
    the first hosts in numeric order that fit and how many more ("10.0.0.[1,9] and 298
    more"), cut at a host, never inside a name; the count alone ("300 hosts") where not
    even one host fits, which may itself be longer than a `room` under ten. For a text
    with a bound (a finding on the wire) that must keep what follows the list: cut at its
    end instead, the list would lose the reason after it."""
    names = list(names)
    whole = collect_hostlist(names)  # (the library orders them itself)
    if len(whole) <= room or not names:
        return whole
    names = _numeric(set(names))  # ordered only to be cut: it costs as much as the fold

    def head(k: int) -> str:
        return f"{collect_hostlist(names[:k])} and {len(names) - k} more"

    # A few hundred characters hold tens of hosts, not thousands: the prefix that fits is
    # found by doubling from one host, then halving, so no list longer than about twice
    # it is folded (4,096 scattered hosts: one fold of all of them above, the rest small).
    # A longer prefix is longer nearly always (a host that closes a range can shorten
    # it), so the count found fits, though not always the most that would.
    fits, over = 0, 1
    while over < len(names) and len(head(over)) <= room:
        fits, over = over, over * 2
    over = min(over, len(names))
    while over - fits > 1:
        mid = (fits + over) // 2
        if len(head(mid)) <= room:
            fits = mid
        else:
            over = mid
    return head(fits) if fits else f"{len(names)} host{'s' if len(names) != 1 else ''}"


def _numeric(names: Iterable[str]) -> list[str]:
    """`gpu2` before `gpu10`, as a host list folds them."""
    try:
        return list(hostlist.numerically_sorted(names))
    except Exception:  # an odd name the library cannot order: as strings
        return sorted(names)


# A host name a shell, pdsh and Slurm take as it is: what goes into a host list someone
# pastes. Node names come from the network; any other is left out (and said so) rather
# than let `gpu[001-999]` or `a,b` stand for hosts it does not name.
_PLAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def paste_hostlist(names: Iterable[str]) -> tuple[str, list[str]]:
    """(the host list of the plain names, the names left out)."""
    plain: list[str] = []
    odd: list[str] = []
    for name in names:
        (plain if _PLAIN.fullmatch(name) else odd).append(name)
    return (collect_hostlist(sorted(set(plain))) if plain else ""), odd
