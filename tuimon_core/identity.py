"""Who speaks for a node name: the one rule the viewer and the relay both keep.

A node's findings, its place in the fleet comparison and the causes put down to it come
from the target that holds its name. That is the target the configuration names (its
host is the name: `gpu042:9477` for `gpu042`), else the first to say the name in a
hello. A second target that says a held name is a duplicate: refused (its frames are not
merged into the node's), and named as a finding, so a hostile agent that calls itself
`gpu042` can neither raise a finding on gpu042 nor hide a difference of its fleet.

Who speaks for a node's frames (`may_carry`): an agent only for itself, a relay only for
the nodes it carries, never for one the reader watches directly or another relay
carries (and a rank only for its own steps: tuimon.model.step_credit).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from tuimon_core.findings import Finding

# Duplicate targets remembered; past this, further ones are refused without a record of
# which name they said (a peer renaming itself every hello cannot grow this table).
MAX_DUPLICATES = 4096


def _host(target: str) -> str:
    """A target's host, lower-cased: `gpu042:9477` -> `gpu042`, `[::1]:9477` -> `::1`."""
    host = target.rpartition(":")[0] if ":" in target and not target.endswith("]") else target
    return host.strip("[]").lower()


def named_by(target: str, name: str) -> bool:
    """Does the configuration name this node (the target's host is the node's name, or
    its first label: `gpu042.cluster:9477` names `gpu042`)?"""
    host, name = _host(target), name.lower()
    return host == name or host.split(".", 1)[0] == name.split(".", 1)[0] == name


class Carried(Protocol):
    """A node as a reader (the viewer's NodeState, the relay's Source) knows it."""

    owner: str | None  # the relay that carries it; None: watched directly


def may_carry(known: Carried | None, relay: str, add: Callable[[], Carried]) -> bool:
    """May `relay` speak for a node (its frames in the relay's batches)? Yes for a node
    new to the reader (`add` makes it, and it is the relay's from then on) or already
    that relay's; no for one watched directly or carried by another relay. The one rule
    of the viewer (ClusterState.claim) and of a relay for its upstream relays
    (FanOut.claim)."""
    if known is None:
        add().owner = relay
        return True
    return known.owner == relay


@dataclass(frozen=True, slots=True)
class Duplicate:
    name: str
    target: str  # the refused one
    holder: str  # the one that holds the name


class NameHolders:
    """node name -> the target that holds it; and the targets refused for saying a held
    name."""

    def __init__(self) -> None:
        self._holder: dict[str, str] = {}
        self._name: dict[str, str] = {}  # target -> the name it holds
        self.duplicates: dict[str, Duplicate] = {}  # refused target -> what it said

    def claim(self, target: str, name: str) -> list[str]:
        """`target` says it is `name` (a hello). Returns the targets whose standing
        changed: `target` itself where it is refused, and a holder that loses the name
        to the target the configuration names. Check `refused(target)` after."""
        self.release(target)
        holder = self._holder.get(name)
        if holder is None or holder == target:
            self._hold(target, name)
            return []
        if named_by(target, name) and not named_by(holder, name):
            self.release(holder)
            self._hold(target, name)
            self._refuse(holder, name, target)
            return [holder]
        self._refuse(target, name, holder)
        return [target]

    def release(self, target: str) -> None:
        """`target` is gone, or says another name: what it held is free."""
        self.duplicates.pop(target, None)
        name = self._name.pop(target, None)
        if name is not None and self._holder.get(name) == target:
            del self._holder[name]

    def refused(self, target: str) -> Duplicate | None:
        return self.duplicates.get(target)

    def holder(self, name: str) -> str | None:
        return self._holder.get(name)

    def _hold(self, target: str, name: str) -> None:
        self._holder[name] = target
        self._name[target] = name

    def _refuse(self, target: str, name: str, holder: str) -> None:
        if target in self.duplicates or len(self.duplicates) < MAX_DUPLICATES:
            self.duplicates[target] = Duplicate(name, target, holder)

    def findings(self) -> list[Finding]:
        """A finding per name said by more than one target, naming them: never merged."""
        by_name: dict[str, list[Duplicate]] = {}
        for dup in self.duplicates.values():
            by_name.setdefault(dup.name, []).append(dup)
        out = []
        for name, dups in sorted(by_name.items()):
            holder = dups[0].holder
            others = ", ".join(sorted(d.target for d in dups))
            out.append(Finding("warning", "duplicate_name",
                               f"{name} is said by {len(dups) + 1} targets: {holder} holds "
                               f"the name, {others} refused (not merged)",
                               target=others))  # about the refused, not the holder
        return out

    def message(self, target: str) -> str | None:
        """Why `target` is refused, for its node's reason (None: it is not)."""
        dup = self.duplicates.get(target)
        if dup is None:
            return None
        return f"refused: node name {dup.name} is held by {dup.holder}"
