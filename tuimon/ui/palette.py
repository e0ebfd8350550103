"""The command palette's own entries (ctrl+p, or `:`): every key of the main screen as a
command, and a jump to any node, leaf switch, job or finding by its name, so an engineer
who knows the name need not walk the map to it."""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial
from typing import TYPE_CHECKING

from textual.app import SystemCommand
from textual.binding import Binding

from tuimon.model.finding_groups import group
from tuimon_core.protocol.text import clean

if TYPE_CHECKING:
    from tuimon.ui.app import TuimonApp

# A jump's title is searched and drawn: a name from outside is cut and made printable.
NAME_CHARS = 60


def palette_commands(app: TuimonApp) -> Iterable[SystemCommand]:
    """The app's keys, then its nodes, leaves, jobs and findings; only the keys are
    listed before one types (the names are found by typing them)."""
    for binding in app.BINDINGS:
        if not isinstance(binding, Binding) or binding.action in ("quit", "go_to"):
            continue
        if not app.offers(binding.action):
            continue
        yield SystemCommand(binding.description, f"key {binding.key_display or binding.key}",
                            partial(app.run_action, binding.action))
    for node in sorted(app.cluster.nodes.values(), key=lambda n: n.name):
        yield SystemCommand(f"node {clean(node.name)[:NAME_CHARS]}", "open the node's screen",
                            partial(app.open_components, [node.name], None, None),
                            discover=False)
    for leaf in sorted(set(app.view.topology.values())):
        yield SystemCommand(f"leaf {clean(leaf)[:NAME_CHARS]}", "the map filtered to its nodes",
                            partial(app.open_components, [], leaf, None), discover=False)
    for job in sorted(app.efficiency.jobs):
        yield SystemCommand(f"job {clean(job)[:NAME_CHARS]}",
                            "the strip shows the job, the map its nodes",
                            partial(app.open_components, [], None, job), discover=False)
    for g in group(app.diagnosis.findings):
        named_job = next((f.job for f in g.findings if f.job), None)
        yield SystemCommand(f"finding {clean(g.text)[:NAME_CHARS]}",
                            f"{g.severity}: opens what it names",
                            partial(app.open_components, g.nodes, g.leaf, named_job),
                            discover=False)
