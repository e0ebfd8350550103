"""The help screen (`?`): the keys, and what the map's cells mean, with the maps' own
metrics; a player's keys added where the app replays a recording."""

from __future__ import annotations

import textwrap

from textual.binding import Binding

from tuimon.model.map_kinds import FABRIC_MAP, GPU_MAP
from tuimon.text.markup import safe
from tuimon.ui.text_screen import TextScreen

HELP = """\
[b]tuimon[/b]: the whole cluster, live

[b]Moving[/b]
  arrows, h j k l   move between nodes
  enter, dbl-click  open the node
  tab               GPU / fabric map (the same node stays selected)
  f                 to the diagnosis: up/down pick, enter opens its node
                    (c copies its nodes' host list, d shows the Slurm
                    command to drain them: copied, never run)
  : or ctrl+p       go to a node, leaf, job, finding by name; commands
  pgup pgdn         a page up or down in a list or a screen of text
  esc               back; clear the filter
[b]What the map shows[/b]
{metric_keys}  s  S              sort by name / by the metric (worst first); reverse
  /                 filter: host list (gpu[008-015]), leaf, text, regex;
                    text also finds Slurm job ids, pods, users, jobs
[b]Other[/b]
  J                 next job in the efficiency strip
  b, click strip    the job: what its budget went to, its ranks, nodes;
                    m there shows its nodes on the map
  i                 the fleet: drivers, firmware, links, grouped by node
  H                 history: the relay's incidents over the last day,
                    as a timeline with what each cost; enter opens one
  t                 next theme        ?  this help        q  quit

Cells follow the metric in height and colour. [$error]\u2717[/] a failed GPU or
port, or GPUs the agent cannot see; \u2591 a stale or lost node (old
data); \u00b7 no data. Larger than the room the panes below leave, the
map drops what every node's name begins with (the cursor's whole name
is in the legend), then folds to one cell per node. A stale node keeps
its last values and its reason; tuimon reconnects on its own.{extra}

esc or ? closes this."""



def _metric_keys() -> str:
    """The help's lines for the number keys, from the maps' own metrics."""
    lines = []
    for kind in (GPU_MAP, FABRIC_MAP):
        keys = f"1..{len(kind.metrics)}" + ("" if kind is GPU_MAP else f" ({kind.key})")
        names = ", ".join(safe(m.label) for m in kind.metrics)
        wrapped = textwrap.wrap(f"{kind.title}: {names}", 52)
        lines.append(f"  {keys:<18}{wrapped[0]}")
        lines += [" " * 20 + rest for rest in wrapped[1:]]
    return "\n".join(lines) + "\n"


class HelpScreen(TextScreen):
    BINDINGS = [Binding("escape,question_mark,q", "app.pop_screen", "close", id="close_help")]
    MAX_WIDTH = 78  # fits 80 columns

    def __init__(self, extra: str = "") -> None:
        super().__init__()
        self.extra = extra

    def text(self) -> str:
        return HELP.format(extra=self.extra, metric_keys=_metric_keys())
