"""The cluster heatmaps: Line API widgets with cached strips.

Each line of the map is a row of node tiles (name, then one cell per GPU or port), or a
group label (a leaf switch). `render_line` builds a line's `Strip` once and keeps it in a
bounded LRU cache under a key of everything it shows (the nodes' versions, the metric,
the cursor, the theme); the refresh timer and the cursor ask for a redraw only of lines
whose key changed. When the cluster is larger than the screen, the map folds to one cell
per node. Colours come from component classes styled with theme variables, so a theme
file (or the user's CSS) restyles the map without code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.cells import cell_len, set_cell_size
from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding
from textual.cache import LRUCache
from textual.events import Click, Resize
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from tuimon.model.cluster import ClusterState
from tuimon.model.map_kinds import (
    FAILED,
    GLYPHS,
    GPU_MAP,
    LEVELS,
    NO_DATA,
    HeatMetric,
    MapKind,
    fold,
)
from tuimon.model.node_state import NodeState
from tuimon.model.view_state import ViewState
from tuimon_core.node_states import DOWN, STALE
from tuimon_core.protocol.text import clean

NAME_W = 12
GAP = 2


@dataclass(slots=True)
class _Line:
    label: str | None  # a group header line, or None for a line of tiles
    nodes: list[NodeState]


MAP_SHARE = 0.5  # of the terminal's height, at most, for the map; the diagnosis gets the rest
MIN_ROWS = 2
# Drawn lines kept: a few screens of a 200-row terminal; scrolling a 16k-node unfolded map
# must not keep every line it ever drew.
STRIP_CACHE_LINES = 1024

_HEAT_CSS = "\n".join(f"    HeatmapView > .heatmap--heat-{i} {{ color: $heat-{i}; }}"
                      for i in range(LEVELS))


class HeatmapView(ScrollView, can_focus=True):
    """A heatmap of the cluster: one tile per node, one cell per GPU (or port). Its keys
    are its own (arrows, h j k l, enter, a number key per metric): they act only while it
    has the focus."""

    BINDINGS = [
        Binding("left,h", "move(-1,0)", "left", show=False, id="left"),
        Binding("right,l", "move(1,0)", "right", show=False, id="right"),
        Binding("up,k", "move(0,-1)", "up", show=False, id="up"),
        Binding("down,j", "move(0,1)", "down", show=False, id="down"),
        Binding("enter", "open", "open node", id="open_node"),
    ]

    class MetricChanged(Message):
        pass

    COMPONENT_CLASSES = {
        "heatmap--name", "heatmap--cursor", "heatmap--stale", "heatmap--down",
        "heatmap--failed", "heatmap--fault-critical", "heatmap--fault-warning",
        "heatmap--label", "heatmap--rule", "heatmap--nodata",
        *(f"heatmap--heat-{i}" for i in range(LEVELS)),
    }

    DEFAULT_CSS = """
    HeatmapView { height: 2; background: $surface; }
    HeatmapView:focus { background: $surface; }
    HeatmapView > .heatmap--name { color: $foreground; }
    HeatmapView > .heatmap--cursor { color: $background; background: $primary; text-style: bold; }
    HeatmapView > .heatmap--stale { color: $heat-stale; text-style: italic; }
    HeatmapView > .heatmap--down { color: $error; text-style: strike; }
    HeatmapView > .heatmap--failed { color: $error; text-style: bold; }
    HeatmapView > .heatmap--fault-critical { color: $error; text-style: bold underline; }
    HeatmapView > .heatmap--fault-warning { color: $warning; text-style: bold underline; }
    HeatmapView > .heatmap--label { color: $accent; text-style: bold; }
    HeatmapView > .heatmap--rule { color: $heat-stale; }
    HeatmapView > .heatmap--nodata { color: $heat-nodata; }
""" + _HEAT_CSS + "\n"

    # Which node the cursor is on, by its index in the map's order. Every assignment
    # (always_update) scrolls it into view, redraws the lines it left and entered, and
    # tells the app; the layout moves it silently (set_reactive) when the order changes.
    cursor: reactive[int] = reactive(0, repaint=False, always_update=True, init=False)

    class CursorMoved(Message):
        def __init__(self, node: NodeState | None) -> None:
            super().__init__()
            self.node = node

    class Opened(Message):
        def __init__(self, node: NodeState) -> None:
            super().__init__()
            self.node = node

    def __init__(self, cluster: ClusterState, view: ViewState, kind: MapKind = GPU_MAP,
                 *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.cluster = cluster
        self.view = view
        self.map_kind = kind
        self.metrics = kind.metrics
        self.metric_index = 0
        # A number key per metric this map offers (1..N), bound on this instance: the
        # GPU map and the fabric map offer different counts.
        count = len(self.metrics)
        for i in range(count):
            self._bindings.key_to_bindings.setdefault(str(i + 1), []).append(
                Binding(str(i + 1), f"metric({i})", "metric", show=i == 0,
                        id=f"metric_{i + 1}", key_display=f"1-{count}"))
        self.folded = False
        # How a node's name is drawn in an unfolded map: its width, the characters every
        # name shares cut from its front, the gap after its cells (narrowed together).
        self._name_w, self._cut, self._gap = NAME_W, 0, GAP
        self._hm_order: list[NodeState] = []
        self._hm_lines: list[_Line] = []
        self._hm_where: dict[str, tuple[int, int]] = {}  # target -> (line, x)
        self._hm_cells = 8
        # Keyed by what a line shows, so a line whose content changed is simply a miss.
        self._hm_strips: LRUCache[tuple[Any, ...], Strip] = LRUCache(STRIP_CACHE_LINES)
        # line index -> the key refresh_changed found and drew: render_line takes it
        # instead of reading the line's hundred nodes again.
        self._hm_drawn: dict[int, tuple[Any, ...]] = {}
        # target -> (the overview, metric index, the node folded to one cell)
        self._hm_folds: dict[str, tuple[Any, int, int]] = {}
        self._hm_styles: dict[str, Style] = {}
        self._hm_theme_gen = 0
        # Node name -> "critical" | "warning": named by the diagnosis, drawn highlighted.
        self.faults: dict[str, str] = {}
        # What the last refresh_changed looked at: the same again (no sample, no new
        # faults, no move) and it has nothing to redraw.
        self._hm_looked: tuple[Any, ...] | None = None

    # -- public --------------------------------------------------------------------------

    @property
    def metric(self) -> HeatMetric:
        return self.metrics[self.metric_index]

    @property
    def current(self) -> NodeState | None:
        return self._hm_order[self.cursor] if 0 <= self.cursor < len(self._hm_order) else None

    def set_metric(self, index: int) -> None:
        self.metric_index = index % len(self.metrics)
        self.relayout()

    def action_move(self, dx: int, dy: int) -> None:
        self.move(dx, dy)

    def action_metric(self, index: int) -> None:
        if index < len(self.metrics):
            self.set_metric(index)
            self.post_message(self.MetricChanged())

    def action_open(self) -> None:
        self.open_current()

    def select(self, node: NodeState | None) -> None:
        """Put the cursor on this node, if the map shows it."""
        if node is None:
            return
        for i, n in enumerate(self._hm_order):
            if n.target == node.target:
                self.cursor = i
                return

    def validate_cursor(self, value: int) -> int:
        return max(0, min(value, len(self._hm_order) - 1))

    def watch_cursor(self) -> None:
        node = self.current
        if node is not None:
            li, _ = self._hm_where.get(node.target, (0, 0))
            if li < self.scroll_offset.y:
                self.scroll_to(y=li, animate=False)
            elif li >= self.scroll_offset.y + self.size.height:
                self.scroll_to(y=li - self.size.height + 1, animate=False)
        self.refresh_changed()
        self.post_message(self.CursorMoved(node))

    def notify_style_update(self) -> None:
        """Textual calls this whenever the rules that style this widget may have changed (a
        new theme, a reloaded stylesheet, focus): the styles kept per component class and
        every line drawn with them are dropped, and the next draw reads them anew."""
        super().notify_style_update()
        self._hm_styles.clear()
        self._hm_theme_gen += 1
        self._hm_drawn.clear()
        self.refresh()

    def relayout(self) -> None:
        """Recompute which node goes where (nodes, filter, sort or size changed)."""
        current = self.current
        self._hm_order = self.view.visible(self.cluster, self.metric, self.map_kind)
        index = self.cursor
        if current is not None and current in self._hm_order:
            index = self._hm_order.index(current)
        self.set_reactive(HeatmapView.cursor, min(index, max(0, len(self._hm_order) - 1)))
        cpu_nodes = self.view.cpu_nodes
        self._hm_cells = max([self.map_kind.cell_count(n, cpu_nodes) for n in self._hm_order]
                             or [8]) or 1
        width = max(1, self.scrollable_content_region.width or self.size.width or 80)
        # The map's share of the screen, not its own height: the map is as tall as its
        # rows (up to that share) and the diagnosis takes the rest.
        height = self.row_budget()
        order = self._hm_order
        groups = self.view.groups(order) if self.map_kind.grouped else [("", order)]
        self._name_w, self._cut, self._gap = NAME_W, 0, GAP
        lines = self._layout(groups, width, folded=False)
        if len(lines) > height and len(order) > 1:
            # Before folding a node to one cell: its name without what every name on the
            # map shares (`sim-node` of `sim-node007`), the cursor's whole name in the
            # legend; every GPU or port still drawn.
            names = [n.name for n in order]
            cut = _shared_front(names)
            short = max(2, max(cell_len(name[cut:]) for name in names))
            if cut and short < NAME_W:
                self._name_w, self._cut, self._gap = short, cut, 1
                lines = self._layout(groups, width, folded=False)
        if not order and self.view.filter_text:
            lines = [_Line(f"no node matches the filter /{clean(self.view.filter_text)[:60]}/ "
                           "(esc clears it)", [])]
        self.folded = len(lines) > height and len(self._hm_order) > 1
        if self.folded:
            self._name_w, self._cut, self._gap = NAME_W, 0, GAP
            lines = self._layout(groups, width, folded=True)
        self._hm_lines = lines
        self._hm_where = {}
        for li, line in enumerate(lines):
            x = 0
            for node in line.nodes:
                self._hm_where[node.target] = (li, x)
                x += self._tile_width()
        self._hm_strips.clear()
        self._hm_folds.clear()
        self._hm_drawn.clear()
        self.virtual_size = Size(width, len(lines))
        rows = max(MIN_ROWS, min(len(lines), height))
        if self.styles.height is None or self.styles.height.value != rows:
            self.styles.height = rows
        self.refresh()

    def row_budget(self) -> int:
        """The most rows the map may take before it folds, then scrolls."""
        screen = (self.app.size.height if self.is_attached else 0) or 24
        # What the panes around it want (the app's; none where it says nothing).
        elsewhere = getattr(self.app, "rows_elsewhere", None)
        others = elsewhere() if callable(elsewhere) and self.is_mounted else 0
        return max(MIN_ROWS, min(int(screen * MAP_SHARE), screen - others))

    def refresh_changed(self) -> None:
        """Redraw only the visible lines whose content changed since they were drawn.
        Every node's change bumps the cluster's version: with it, the faults, the
        cursor and the lines as they were, no line's key can have changed (a source
        that reads every 5 s leaves four of five ticks so, each a pass over every
        visible node: a twentieth of the app's time at 1024 nodes)."""
        top = self.scroll_offset.y
        # Numbers compared by value, the faults, the cursor's node and the lines by
        # identity (each is replaced, never changed in place).
        looked = (self.cluster.version, self.metric_index, self.folded, self._hm_theme_gen,
                  top, self.size.height, self.faults, self.current, self._hm_lines)
        last = self._hm_looked
        if last is not None and looked[:6] == last[:6] and all(
                a is b for a, b in zip(looked[6:], last[6:])):
            return
        self._hm_looked = looked
        for y in range(self.size.height):
            li = top + y
            if li >= len(self._hm_lines):
                break
            key = self._key(li)
            if key not in self._hm_strips:
                self._hm_strips[key] = self._strip(li)
                self._hm_drawn[li] = key
                self.refresh_line(y)

    def refresh_line(self, y: int) -> None:
        self.refresh_lines(y + self.scroll_offset.y, 1)

    # -- layout --------------------------------------------------------------------------

    @property
    def kind(self) -> str:
        return self.map_kind.key

    def _tile_width(self) -> int:
        return 2 if self.folded else self._name_w + 1 + self._hm_cells + self._gap

    def _layout(self, groups: list[tuple[str, list[NodeState]]], width: int,
                folded: bool) -> list[_Line]:
        tile = 2 if folded else self._name_w + 1 + self._hm_cells + self._gap
        per_line = max(1, width // tile)
        lines: list[_Line] = []
        for label, nodes in groups:
            if label:
                lines.append(_Line(label, []))
            for i in range(0, len(nodes), per_line):
                lines.append(_Line(None, nodes[i:i + per_line]))
        return lines

    # -- drawing ------------------------------------------------------------------------

    def _style(self, name: str) -> Style:
        """The Rich style of a component class: only what its rule sets (partial), so the
        cells add no background escape of their own to every frame; kept per name until
        the theme changes (asked for once a cell)."""
        style = self._hm_styles.get(name)
        if style is None:
            style = self._hm_styles[name] = self.get_component_rich_style(
                f"heatmap--{name}", partial=True)
        return style

    def _key(self, li: int) -> tuple[Any, ...]:
        line = self._hm_lines[li]
        cur = self.current
        faults = self.faults
        if self.folded:
            # What the line shows, not how new its data is: a folded line holds a hundred
            # nodes, each sending a sample a second, and is redrawn only when a cell's
            # glyph or colour would change.
            return (self._hm_theme_gen, self.metric_index, True, line.label,
                    tuple((self._folded_level(n), n.status, n is cur, faults.get(n.name))
                          for n in line.nodes))
        return (self._hm_theme_gen, self.metric_index, False, line.label,
                tuple((n.target, n.version, n.status, n is cur, faults.get(n.name))
                      for n in line.nodes))

    def _folded_level(self, node: NodeState) -> int:
        """The node as one cell, computed once per overview and metric."""
        cached = self._hm_folds.get(node.target)
        if cached is not None and cached[0] is node.overview and cached[1] == self.metric_index:
            return cached[2]
        level = fold(self.metric, self._levels(node))  # the same fold the sort uses
        self._hm_folds[node.target] = (node.overview, self.metric_index, level)
        return level

    def render_line(self, y: int) -> Strip:
        li = y + self.scroll_offset.y
        if li >= len(self._hm_lines):
            # Every segment has a style: Textual's monochrome filter (NO_COLOR) reads it.
            return Strip.blank(self.size.width, self._style("name"))
        key = self._hm_drawn.pop(li, None)
        strip = self._hm_strips.get(key) if key is not None else None
        if strip is None:
            key = self._key(li)
            strip = self._hm_strips.get(key)
            if strip is None:
                strip = self._hm_strips[key] = self._strip(li)
        return strip

    def _strip(self, li: int) -> Strip:
        return self._draw(self._hm_lines[li]).adjust_cell_length(self.size.width,
                                                                 self._style("name"))

    def _draw(self, line: _Line) -> Strip:
        if line.label is not None:
            return Strip([Segment(f" {line.label} ", self._style("label")),
                          Segment("\u2500" * 40, self._style("rule"))])
        segments: list[Segment] = []
        cur = self.current
        for node in line.nodes:
            if self.folded:
                level = self._folded_level(node)
                style = self._cell_style(node, level)
                if node is cur:
                    style = style + Style(reverse=True)
                segments.append(Segment(self._glyph(node, level) * 2, style))
                continue
            levels = self._levels(node)
            fault = self.faults.get(node.name)
            name_style = (self._style("cursor") if node is cur else
                          self._style(self._lost_style(node) if node.old_data
                                      else f"fault-{fault}" if fault else "name"))
            # By cells, not characters: a wide (CJK) name must not push the row over.
            segments.append(Segment(set_cell_size(node.name[self._cut:], self._name_w),
                                    name_style))
            segments.append(Segment(" ", self._style("name")))
            for level in levels:
                segments.append(Segment(self._glyph(node, level), self._cell_style(node, level)))
            pad = self._hm_cells - len(levels) + self._gap
            segments.append(Segment(" " * pad, self._style("name")))
        return Strip(segments)

    def _levels(self, node: NodeState) -> list[int]:
        return self.map_kind.levels(node, self.metric, self.view.cpu_nodes)

    @staticmethod
    def _lost_style(node: NodeState) -> str:
        """Down is drawn struck; stale and unknown (behind a lost relay) as old data."""
        return DOWN if node.status == DOWN else STALE

    def _glyph(self, node: NodeState, level: int) -> str:
        if node.old_data:
            return "\u2591"  # light shade: old data
        if level == FAILED:
            return "\u2717"
        if level == NO_DATA:
            return "\u00b7"
        return GLYPHS[max(1, level)]

    def _cell_style(self, node: NodeState, level: int) -> Style:
        if node.old_data:
            return self._style(self._lost_style(node))
        if level == FAILED:
            return self._style("failed")
        if level == NO_DATA:
            return self._style("nodata")
        return self._style(f"heat-{level}")

    # -- interaction ----------------------------------------------------------------------

    def on_resize(self, event: Resize) -> None:
        self.relayout()

    def move(self, dx: int, dy: int) -> None:
        if not self._hm_order:
            return
        node = self.current
        if node is None:
            self.cursor = 0
        elif dy == 0:
            self.cursor += dx
        else:
            li, x = self._hm_where.get(node.target, (0, 0))
            target_line = li + dy
            while 0 <= target_line < len(self._hm_lines) and not self._hm_lines[target_line].nodes:
                target_line += dy
            if 0 <= target_line < len(self._hm_lines):
                row = self._hm_lines[target_line].nodes
                col = min(len(row) - 1, x // self._tile_width())
                self.cursor = self._hm_order.index(row[col])
            else:
                self.cursor = self.cursor  # at the edge: still say where the cursor is

    def on_click(self, event: Click) -> None:
        li = event.y + self.scroll_offset.y
        if 0 <= li < len(self._hm_lines):
            row = self._hm_lines[li].nodes
            col = event.x // self._tile_width()
            if 0 <= col < len(row):
                self.cursor = self._hm_order.index(row[col])
                if event.chain >= 2:
                    self.post_message(self.Opened(row[col]))

    def open_current(self) -> None:
        node = self.current
        if node is not None:
            self.post_message(self.Opened(node))


def _shared_front(names: list[str]) -> int:
    """How many characters every name begins with (the first and last in order share
    what all of them do)."""
    first, last = min(names), max(names)
    i = 0
    while i < len(first) and first[i] == last[i]:
        i += 1
    # Never into a number (gpu1 and gpu10 are `1` and `10`, not `` and `0`), never a
    # whole name.
    i = min(i, min(len(n) for n in names) - 1)
    while i > 0 and first[i - 1].isdigit():
        i -= 1
    return max(0, i)
