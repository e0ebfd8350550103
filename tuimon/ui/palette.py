"""The command palette's own entries (ctrl+p, or `:`): every key of the main screen as a
command, and a jump to any node, leaf switch, job or finding by its name, so an engineer
who knows the name need not walk the map to it."""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial
from typing import TYPE_CHECKING

from textual.app import App, SystemCommand
from textual.binding import Binding

from tuimon.model.finding_groups import group
from tuimon_core.protocol.text import clean

if TYPE_CHECKING:
    from tuimon.ui.app import TuimonApp

# A jump's title is searched and drawn: a name from outside is cut and made printable.
NAME_CHARS = 60


def _own_bindings(app: TuimonApp) -> Iterable[Binding]:
    """The keys the app's classes declare (a replay's and the map's), not Textual's own;
    each action once, the subclass's first."""
    seen: set[str] = set()
    for cls in type(app).__mro__:
        if cls is App:
            break
        for binding in cls.__dict__.get("BINDINGS", ()):
            if isinstance(binding, Binding) and binding.action not in seen:
                seen.add(binding.action)
                yield binding


def palette_commands(app: TuimonApp) -> Iterable[SystemCommand]:
    """The app's keys, then its nodes, leaves, jobs and findings; only the keys are
    listed before one types (the names are found by typing them)."""
    for binding in _own_bindings(app):
        if binding.action in ("quit", "go_to") or not app.offers(binding.action):
            continue
        yield SystemCommand(binding.description, f"key {app.get_key_display(binding)}",
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
