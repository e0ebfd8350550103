"""What an on-call does with a finding's nodes: paste their host list into pdsh,
`scontrol` or the map's filter, or drain them. The app copies the list and shows the
drain command; tuimon never runs it.

Node names come from the network. Only names a shell and Slurm take as they are
(letters, digits, `.`, `_`, `-`) go into a host list or a command; any other is left
out and said so, so that a pasted command cannot run what a hostile name carries.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from tuimon_core.hostlist import paste_hostlist

_REASON = re.compile(r"[^A-Za-z0-9 ._:,/()+=-]")
REASON_MOST = 120  # characters of a drain reason (Slurm keeps it in the node's record)


def host_list(nodes: Iterable[str]) -> tuple[str, list[str]]:
    """(the host list of the plain names, the names left out: tuimon_core.hostlist)."""
    return paste_hostlist(nodes)


def drain_command(nodes: Iterable[str], reason: str) -> tuple[str, list[str]]:
    """Slurm's command to drain these nodes, quoted for a POSIX shell, with the reason
    (reduced to plain characters); and the names left out. "" when none is left."""
    hosts, odd = host_list(nodes)
    if not hosts:
        return "", odd
    why = _REASON.sub(" ", f"tuimon: {reason}")[:REASON_MOST].strip()
    return f"scontrol update NodeName='{hosts}' State=DRAIN Reason='{why}'", odd
