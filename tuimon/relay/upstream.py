"""One upstream node (an agent, or a node an upstream relay carries) as the relay last
saw it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tuimon.relay.sample_frame import SampleFrame
from tuimon_core.node_rules import NodeRules
from tuimon_core.node_states import CONNECTING
from tuimon_core.protocol.families import Frame


@dataclass(slots=True)
class Source:
    """One upstream node, as the relay last saw it."""

    name: str  # the target the relay connects to, e.g. gpu001:9477
    state: str = CONNECTING  # one of SOURCE_STATES (tuimon_core.node_states)
    reason: str | None = None
    node: str | None = None  # the hello's node name
    hello: Frame | None = None
    port_ids: list[str] = field(default_factory=list)  # the hello's fabric ports
    sample: SampleFrame | None = None
    last_seen: float | None = None  # monotonic
    frames: int = 0
    owner: str | None = None  # the upstream relay that carries it; None: a direct target
    # What the node's own rules found in its latest sample (its `findings` family).
    conditions: list[dict[str, Any]] | None = None
    # The relay's own rules for a node whose agent predates findings.
    rules: NodeRules | None = None

    def names(self) -> tuple[str, ...]:
        host = self.name.rsplit(":", 1)[0]
        return (self.name, host, self.node) if self.node else (self.name, host)
