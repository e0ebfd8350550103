"""The small panels around the heatmaps: header, efficiency strip, storage, events."""

from __future__ import annotations

import itertools
import time

from rich.style import Style
from textual import events
from textual.binding import Binding
from textual.content import Content
from textual.message import Message
from textual.strip import Strip
from textual.visual import VisualType
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from tuimon.model.cluster import ClusterState
from tuimon.model.diagnosis import Finding
from tuimon.model.efficiency import WINDOWS, EfficiencyView
from tuimon.model.finding_groups import FindingGroup, group
from tuimon.model.host_actions import drain_command, host_list
from tuimon.model.map_kinds import GLYPHS, LEVELS, HeatMetric
from tuimon.model.slo import (
    BurnReadout,
    LedgerBurn,
    budget_scope,
    burn_parts,
    coverage_text,
)
from tuimon.model.storage import StorageView, near_provisioned
from tuimon.text.markup import safe
from tuimon.text.severity import severity_style
from tuimon.text.sparkline import sparkline
from tuimon_core.node_states import CONNECTING, DOWN, STALE, UNKNOWN, UP
from tuimon_core.protocol.text import clean
from tuimon_core.units import rate, size
from tuimon_core.wait_kinds import said, said_hours
from tuimon_core.wording import duration_text, held_text

# A job's verdict (tuimon.model.efficiency.JobVerdict) as the strip shows it.
_VERDICT = {"stopped": "[$error]STOPPED {stopped}[/]: {cause}",
            "page": "[$error]PAGE[/]", "ticket": "[$warning]TICKET[/]",
            "stale": "[$warning]no step reports for {age:.0f} s[/]",
            "degraded": "[$warning]degraded[/]", "ok": "[$success]ok[/]"}


class Panel(Static):
    """A Static that re-renders only when its text changed. The panels are set every
    second; an unchanged `update` still costs a markup parse and a layout pass of the
    screen (measured at 4096 nodes: most of the app's own drawing time)."""

    _shown_text: object = None

    def update(self, content: VisualType = "", *, layout: bool = True) -> None:
        if isinstance(content, str) and content == self._shown_text:
            return
        moves = layout and self._moves_others(self._shown_text, content)
        self._shown_text = content
        # A new text that leaves the panel its size (the header's one line, the storage
        # pane's same mounts with new rates) is redrawn alone: a layout pass of the whole
        # screen each second was most of a quiet second's drawing.
        super().update(content, layout=moves)

    def _moves_others(self, shown: object, content: VisualType) -> bool:
        """Can `content` in place of `shown` change the panel's size?"""
        styles = self.styles
        if styles.width is not None and styles.width.is_auto:
            return True
        if styles.height is not None and not styles.height.is_auto:
            return False  # its styles fix it (a number of lines, a share of the screen)
        # A line that does not wrap is one row: as many lines, as many rows.
        return not (isinstance(content, str) and isinstance(shown, str)
                    and styles.text_wrap == "nowrap"
                    and content.count("\n") == shown.count("\n"))


class HeaderBar(Panel):
    # No panel wraps (a wrapped line lands in column 0 and pushes the map): lines are cut
    # with an ellipsis at the edge instead, and each panel puts what matters first.
    DEFAULT_CSS = """
    HeaderBar { height: 1; background: $panel; color: $foreground; text-wrap: nowrap;
                text-overflow: ellipsis; }
    """

    def update_from(self, cluster: ClusterState, folded: bool, width: int = 200,
                    now_text: str | None = None, judged_every: float | None = None) -> None:
        """`judged_every`: seconds between judgements, when more than the refresh (a
        cluster large enough that the app judges it less often than it draws)."""
        c = cluster.counts()
        interval = cluster.interval()
        down = f"[$error]{c[DOWN]} down[/]" if c[DOWN] else "0 down"
        stale = f"[$warning]{c[STALE]} stale[/]" if c[STALE] else "0 stale"
        narrow = width < 100  # 80 columns: the counts and the clock, the name shortened
        sep = "/" if narrow else " / "
        parts = [
            f"[b]tuimon[/b] [$accent]{safe(cluster.name, 16 if narrow else 40)}[/]",
            f"nodes [$success]{c[UP]} up[/]{sep}{stale}{sep}{down}"
            + (f"{sep}[$warning]{c[UNKNOWN]} unknown[/]" if c[UNKNOWN] else "")
            + (f" / {c[CONNECTING]} connecting" if c[CONNECTING] else ""),
            f"{cluster.gpu_total()} GPUs",
            (f"every {interval:g}s" if interval else "interval -")
            + (f", judged every {judged_every:.3g}s" if judged_every else ""),
            now_text or time.strftime("%H:%M:%S"),
        ]
        if folded:
            parts.insert(3, "[$warning]folded[/]" if narrow else
                         "[$warning]folded: 1 cell per node[/]")
        if narrow:
            parts[1] = parts[1].replace("nodes ", "", 1)
        if width < 120:
            parts = [p for p in parts if not p.startswith("every")]
            self.update(" \u2502 ".join(parts))
            return
        self.update("  \u2502  ".join(parts))


class SloStrip(Panel):
    """The efficiency strip: the shown job's numbers; a click opens its screen."""

    DEFAULT_CSS = """
    SloStrip { height: auto; max-height: 3; background: $panel; color: $foreground;
               text-wrap: nowrap; text-overflow: ellipsis; }
    """

    async def on_click(self) -> None:
        await self.app.run_action("job")

    def update_from(self, width: int, eff: EfficiencyView | None = None,
                    selected: int = 0) -> None:
        if eff is None or not eff.jobs:
            proxy = (f" proxy from GPU busy: [b]{eff.proxy:.2f}[/b] (proxy)"
                     if eff is not None and eff.proxy is not None else "")
            if width < 150:
                self.update(f" [b]efficiency[/b] [$warning]no step telemetry[/]{proxy}")
                return
            self.update(" [b]efficiency / SLO[/b]  [$warning]no step telemetry available[/]: "
                        "training ranks are not reporting steps (agent.reporter), so SLI and "
                        f"error budget cannot be computed.{proxy}")
            return
        now = eff.now
        lines = []
        jobs = sorted(eff.jobs.values(), key=lambda s: s.job)
        selected %= len(jobs)
        for state in (jobs[selected:] + jobs[:selected])[:1]:
            slis = state.sli_windows(now)
            sli_texts = [f"{w} [b]{sli:.2f}[/b]{coverage_text(seen, w, WINDOWS[w])}"
                         if sli is not None else f"{w} -"
                         for w, (sli, seen) in slis.items()]
            throughput = state.throughput(WINDOWS["1m"], now)
            versus = eff.efficiency(state, throughput)
            sli_now = slis["1m"][0]
            ok = sli_now is not None and sli_now >= eff.slo.target
            sli_color = "$success" if ok else "$error"
            if versus is not None and versus[1] == "baseline":
                effic = f"scaling efficiency [b]{versus[0]:.2f}[/b]"
            elif versus is not None:
                effic = f"efficiency [b]{versus[0]:.2f}[/b] vs {versus[1]}"
            else:
                effic = (f"compute fraction [b]{sli_now:.2f}[/b] (no baseline)"
                         if sli_now is not None else "compute fraction -")
            burn = state.burn.burn_rates(now) if state.burn else {}
            used = state.burn.consumed_hours if state.burn else 0.0
            left = eff.slo.remaining_hours(used)
            verdict = state.verdict(now)
            burn_windows, burn_alert = burn_parts(
                burn, verdict.firing, state.burn.coverage(now) if state.burn else None)
            status = _VERDICT[verdict.state].format(
                age=verdict.steps_age or 0, stopped=duration_text(verdict.steps_age or 0),
                cause=safe(verdict.cause or "no finding", 40))
            share = max(0.0, min(1.0, left / eff.slo.budget_hours))
            bar = "\u2588" * round(share * 10) + "\u2591" * (10 - round(share * 10))
            to_empty = eff.slo.hours_to_exhaustion(used, burn.get("1h") or 0.0)
            mfu = eff.mfu(state, throughput)
            which = f" [{selected + 1}/{len(jobs)}, J: next]" if len(jobs) > 1 else ""
            waits = said(state.wait_shares(WINDOWS["1h"], now)[1])
            spent = said_hours(state.burn.spent_hours if state.burn else {})
            reporting = verdict.reporting
            ranks = (f"[$warning]{reporting} of {state.world} ranks[/]"
                     if reporting < state.world else
                     f"{state.world} rank{'s' if state.world != 1 else ''}")
            straggler = ""
            if state.stragglers:
                st = state.stragglers[0]
                straggler = (f"[$warning]straggler[/] {safe(st.node, 20)} x{st.ratio:.2f}"
                             + (f" +{len(state.stragglers) - 1} ranks"
                                if len(state.stragglers) > 1 else f" GPU {st.gpu}"))
            # What an on-call engineer needs first stays at any width: the job, the SLI,
            # the budget left, the burn and the verdict; the rest comes as room allows,
            # in the order of `keep` (higher stays longer).
            parts = [
                (9, f" [b]{safe(state.job, 24 if width >= 120 else 16)}[/b]"),
                (3, which), (6, f" ({ranks})"),
                (9, f"  [{sli_color}]SLI[/]"),
                (2, f" [$heat-4]{sparkline(eff.sli_series(state, 30), 30, 1.0)}[/]"),
                (9, f" {sli_texts[0]}"), (6, "".join(" " + t for t in sli_texts[1:])),
                # Without a baseline the compute fraction is the SLI again: kept less.
                (5 if versus is not None else 3, f"  {effic}"),
                (6, f"  waiting 1h: {waits}" if waits else ""),
                (1, f"  MFU [b]{mfu:.2f}[/b]" if mfu is not None else ""),
                (4, f"  {throughput:,.0f} samples/s" if throughput else "  - samples/s"),
                (6, f"  budget{_budget_scope(state.burn)}"), (3, f" [$heat-4]{bar}[/]"),
                (9, f"  {left:.1f}/{eff.slo.budget_hours:.0f} h left"),
                (4, f", empty in {to_empty:.0f} h" if to_empty is not None else ""),
                (6, f" (spent on {spent})" if spent else ""),
                (9, f"  burn {burn_windows}"), (5, f", {burn_alert}" if burn_alert else ""),
                (9, f" {status}"),
                (7, f"  {straggler}" if straggler else ""),
            ]
            if width < 120:  # the verdict first, where the end of the line may be cut
                parts.insert(3, parts.pop(-2))
            lines.append(fit(parts, width))
        self.update("\n".join(lines))


def fit(parts: list[tuple[int, str]], width: int) -> str:
    """Join markup parts, dropping the least kept ones until the line fits `width`
    cells; what must stay (the highest `keep`) is cut with an ellipsis only as a last
    resort, by the widget."""
    shown = [(keep, text) for keep, text in parts if text]
    def cells(items: list[tuple[int, str]]) -> int:
        return Content.from_markup("".join(t for _, t in items)).cell_length
    for level in sorted({k for k, _ in shown})[:-1]:  # the most kept always stay
        if cells(shown) <= width:
            break
        shown = [(k, t) for k, t in shown if k > level]
    return "".join(t for _, t in shown)


def _budget_scope(burn: BurnReadout | None) -> str:
    if isinstance(burn, LedgerBurn) and burn.error:
        return " [$error](ledger not writing)[/]"
    return f" ({budget_scope(burn)})"


class Legend(Panel):
    DEFAULT_CSS = """
    Legend { height: 1; color: $foreground; text-wrap: nowrap; text-overflow: ellipsis; }
    """

    def update_from(self, title: str, metric: HeatMetric, metrics: tuple[HeatMetric, ...],
                    cursor_text: str, width: int = 200, view_text: str = "") -> None:
        """`view_text`: the filter and the order, right after the title: what decides
        which nodes the map shows is never cut off the line's end."""
        # The cells' own glyphs in their colours: the scale reads by height without
        # colour, and in ASCII as the map's characters do.
        scale = "".join(f"[$heat-{i}]{GLYPHS[max(1, i)]}[/]" for i in range(LEVELS))
        view = f" [$accent]{view_text}[/] \u2502" if view_text else ""
        if width < 160:  # the key list goes; the footer and `?` have the keys
            self.update(f" [b]{title}[/b]{view} {metric.key} {metric.legend[0]} {scale} "
                        f"{metric.legend[1]} \u2502 {cursor_text}")
            return
        keys = " ".join(f"[b]{i + 1}[/b]:{m.key}" if m is not metric else
                        f"[reverse][b]{i + 1}[/b]:{m.key}[/]" for i, m in enumerate(metrics))
        self.update(f" [b]{title}[/b]{view} {metric.label}  {metric.legend[0]} {scale} "
                    f"{metric.legend[1]}  [$error]\u2717[/] failed  \u2591 stale  \u00b7 n/a  "
                    f"\u2502 {keys}  \u2502 {cursor_text}")


class StoragePanel(Panel):
    DEFAULT_CSS = """
    StoragePanel { height: auto; max-height: 8; border-top: solid $panel; color: $foreground;
                   text-wrap: nowrap; text-overflow: ellipsis; }
    """

    def update_from(self, storage: StorageView, width: int, compact: bool = False) -> None:
        if not storage.filesystems:
            self.update(" [b]storage[/b]  no shared file system reported by any node")
            return
        if compact or width < 150:
            self.update("\n".join(self._compact_line(storage, mount, fs, width)
                                  for mount, fs in sorted(storage.filesystems.items())))
            return
        spark_w = max(8, min(40, width - 110))
        lines = [" [b]storage[/b]  aggregate over nodes"]
        for mount, fs in sorted(storage.filesystems.items()):
            prov = storage.provisioned.get(mount)
            total = fs.read + fs.write
            share = (f"  [{'$error' if near_provisioned(total, prov) else '$foreground'}]"
                     f"{100 * total / prov:.0f}% of {rate(prov)} provisioned[/]" if prov else "")
            cap = (f"  {size(fs.size - fs.free)} / {size(fs.size)} used"
                   if fs.size and fs.free is not None else "")
            top = ", ".join(f"{safe(n, 16)} {rate(v)}" for n, v in fs.top_readers if v)
            writers = ", ".join(f"{safe(n, 16)} {rate(v)}" for n, v in fs.top_writers if v)
            lines.append(
                f"  [$accent]{safe(mount, 24):<24}[/] {safe(fs.fstype or '-', 8):<6} "
                f"read [b]{rate(fs.read):>10}[/] "
                f"[$heat-4]{sparkline(fs.read_hist, spark_w, prov)}[/]"
                f"  write [b]{rate(fs.write):>10}[/] "
                f"[$heat-7]{sparkline(fs.write_hist, spark_w // 2, prov)}[/]{share}{cap}"
                + (f"\n      top readers: {top}" if top else "")
                + (f"   top writers: {writers}" if writers else ""))
        self.update("\n".join(lines))


    @staticmethod
    def _compact_line(storage: StorageView, mount: str, fs: object, width: int) -> str:
        prov = storage.provisioned.get(mount)
        share = f" {100 * (fs.read + fs.write) / prov:.0f}% prov" if prov else ""  # type: ignore[attr-defined]
        spark = max(0, width - 64)
        return (f" [$accent]{safe(mount, 18):<18}[/] R [b]{rate(fs.read):>9}[/] "  # type: ignore[attr-defined]
                f"W [b]{rate(fs.write):>9}[/]{share} "  # type: ignore[attr-defined]
                f"[$heat-4]{sparkline(fs.read_hist, spark, prov)}[/]")  # type: ignore[attr-defined]


_REVERSE = Style(reverse=True)


def _held(g: FindingGroup, now: float, room: int) -> str:
    """The finding with since when it holds where that fits whole; where it does not,
    the finding's own words, which matter more (a narrow terminal)."""
    text = clean(g.text)  # measured as it will be shown: escapes cleaned can be longer
    held = held_text(text, g.since, now)
    return held if len(held) <= room else text


class DiagnosisPane(OptionList):
    """The findings, grouped, worst first: as tall as they are, up to half the screen,
    then scrolls. `f` focuses it; up and down pick a finding, enter opens its node (or
    filters the map to its leaf); escape goes back to the map."""

    MIN_ROWS = 3  # its rule, its header and a finding
    DEFAULT_CSS = f"""
    DiagnosisPane {{ height: auto; max-height: 50%; min-height: {MIN_ROWS}; border: none;
                    border-top: solid $panel; padding: 0; background: $surface; text-wrap: nowrap;
                    text-overflow: ellipsis; }}
    DiagnosisPane:focus {{ border: none; border-top: solid $primary; }}
    """
    BINDINGS = [Binding("escape", "app.focus_map", "back to the map", id="diagnosis_back"),
                Binding("c", "copy_hosts", "copy hosts", id="copy_hosts"),
                Binding("d", "drain_command", "drain command", id="drain_command")]

    class Picked(Message):
        def __init__(self, group: FindingGroup) -> None:
            super().__init__()
            self.group = group

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.groups: list[FindingGroup] = []
        self._shown: list[str] = []

    def update_from(self, findings: list[Finding], width: int, now: float) -> None:
        """`now`: the judgement's clock (Unix time; a replay's own), which says how long
        each finding has held."""
        self.groups = group(findings)
        header = (f"[b]diagnosis[/b]  {len(findings)} finding{'s' if len(findings) != 1 else ''}"
                  f" in {len(self.groups)} line{'s' if len(self.groups) != 1 else ''}, worst "
                  "first  (f: select, enter: open, c: copy hosts, d: drain)") if findings else \
            "[b]diagnosis[/b]  nothing wrong found"
        room = max(20, width - 14)
        lines = [header] + [
            f"[{severity_style(g.severity)}]{g.severity:<8}[/] {safe(_held(g, now, room), room)}"
            for g in self.groups]
        if lines == self._shown:
            return  # unchanged: keep the highlight where the user left it
        if len(lines) == len(self._shown):
            # As many lines as shown (most often the same findings, older): each changed
            # line in place, the highlight and the scroll where the user left them.
            for i, (line, was) in enumerate(zip(lines, self._shown)):
                if line != was:
                    self.replace_option_prompt_at_index(i, Content.from_markup(line))
            self._shown = lines
            return
        self._shown = lines
        keep = self.highlighted
        self.clear_options()
        self.add_options([Option(Content.from_markup(lines[0]), disabled=True)]
                         + [Option(Content.from_markup(t)) for t in lines[1:]])
        if keep is not None and self.groups:
            self.highlighted = min(keep, len(self.groups))

    def on_focus(self, event: events.Focus) -> None:
        """`f` then enter opens the worst finding: with none picked yet, focusing the
        pane picks the first (the header line above it is not a finding)."""
        if self.groups and not self.highlighted:
            self.highlighted = 1

    def render_line(self, y: int) -> Strip:
        """Under NO_COLOR the picked finding in reverse video: Textual draws its
        highlight as swapped colours, which no colour leaves as plain bold."""
        strip = super().render_line(y)
        if self.app.no_color and self.highlighted is not None:
            try:  # the option on this line (Textual's own layout of its lines)
                index = self._lines[self.scroll_offset.y + y][0]
            except (AttributeError, IndexError, TypeError):
                return strip
            if index == self.highlighted:
                strip = strip.apply_style(_REVERSE)
        return strip

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        index = event.option_index - 1
        if 0 <= index < len(self.groups):
            self.post_message(self.Picked(self.groups[index]))

    def _picked(self) -> FindingGroup | None:
        index = (self.highlighted or 0) - 1
        return self.groups[index] if 0 <= index < len(self.groups) else None

    def action_copy_hosts(self) -> None:
        """The picked finding's nodes as a host list, to the clipboard (OSC 52) and on
        the screen (a terminal that refuses OSC 52 still shows it to select)."""
        picked = self._picked()
        hosts, odd = host_list(picked.nodes) if picked else ("", [])
        if not hosts:
            self.app.notify("this finding names no node" + _left_out(odd), markup=False)
            return
        self.app.copy_to_clipboard(hosts)
        self.app.notify(f"copied: {hosts}{_left_out(odd)}", title="host list",
                        timeout=20, markup=False)

    def action_drain_command(self) -> None:
        """Slurm's command to drain the picked finding's nodes: shown and copied, never
        run."""
        picked = self._picked()
        command, odd = (drain_command(picked.nodes, picked.kind.replace("_", " "))
                        if picked else ("", []))
        if not command:
            self.app.notify("this finding names no node" + _left_out(odd), markup=False)
            return
        self.app.copy_to_clipboard(command)
        self.app.notify(f"{command}\n(copied; tuimon does not run it){_left_out(odd)}",
                        title="drain with Slurm", timeout=30, markup=False)


def _left_out(odd: list[str]) -> str:
    return (f"\n{len(odd)} name(s) left out: not plain host names" if odd else "")


class EventsPane(Panel):
    # Its rule and one line at least: on a short terminal the map takes the rest.
    MIN_ROWS = 2
    DEFAULT_CSS = f"""
    EventsPane {{ height: 1fr; min-height: {MIN_ROWS}; border-top: solid $panel;
                 color: $foreground; text-wrap: nowrap; text-overflow: ellipsis; }}
    """

    def update_from(self, cluster: ClusterState, width: int = 200) -> None:
        """As many of the newest events as the pane has lines (it takes what the map and
        the diagnosis leave)."""
        if not cluster.events:
            self.update(" [b]events[/b]  none yet")
            return
        rows = max(2, self.content_size.height - 1)
        lines = [f" [b]events[/b]  newest first ({len(cluster.events)} kept)"]
        for ev in itertools.islice(cluster.events, rows):
            color = severity_style(ev.severity)
            when = time.strftime("%H:%M:%S", time.localtime(ev.ts))
            # A finding's words name what it is about, an agent's own event's (its
            # inventory changed) do not: each line names its node once. A narrow screen
            # has no node column: the node goes before words that lack it.
            if width < 120:
                text = ev.message
                if ev.node and ev.node not in text:
                    text = f"{clean(ev.node)[:20]} {text}"
                lines.append(f" {when} [{color}]{safe(ev.severity, 4)}[/] "
                             f"{safe(text, max(20, width - 16))}")
            else:
                text = ev.message
                if ev.node and text.startswith(f"{ev.node} "):
                    text = text[len(ev.node) + 1:]  # in its column already
                lines.append(f"  {when} [{color}]{safe(ev.severity, 8):<8}[/] "
                             f"{safe(ev.node, 20):<20} "
                             f"{safe(text, max(20, width - 42))}")
        self.update("\n".join(lines))
