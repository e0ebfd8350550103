"""The small panels around the heatmaps: header, efficiency strip, storage, events."""

from __future__ import annotations

import time

from textual.widgets import Static

from tuimon.model.cluster import ClusterState
from tuimon.model.diagnosis import Finding
from tuimon.model.efficiency import WINDOWS, EfficiencyView
from tuimon.model.heat import HeatMetric
from tuimon.model.slo import LedgerBurn
from tuimon.model.storage import StorageView
from tuimon.ui.text import rate, safe, size, sparkline

SEVERITY = {"critical": "$error", "warning": "$warning", "info": "$success"}
STALE_STEPS_S = 15.0  # a job whose steps stopped this long ago is shown as stale


class HeaderBar(Static):
    DEFAULT_CSS = "HeaderBar { height: 1; background: $panel; color: $foreground; }"

    def update_from(self, cluster: ClusterState, folded: bool, width: int = 200,
                    now_text: str | None = None) -> None:
        c = cluster.counts()
        interval = cluster.interval()
        down = f"[$error]{c['down']} down[/]" if c["down"] else "0 down"
        stale = f"[$warning]{c['stale']} stale[/]" if c["stale"] else "0 stale"
        parts = [
            f"[b]tuimon[/b] [$accent]{safe(cluster.name, 40)}[/]",
            f"nodes [$success]{c['up']} up[/] / {stale} / {down}"
            + (f" / {c['connecting']} connecting" if c["connecting"] else ""),
            f"{cluster.gpu_total()} GPUs",
            f"every {interval:g}s" if interval else "interval -",
            now_text or time.strftime("%H:%M:%S"),
        ]
        if folded:
            parts.insert(3, "[$warning]folded: 1 cell per node[/]")
        if width < 120:
            parts = [p for p in parts if not p.startswith("every")]
            self.update(" \u2502 ".join(parts))
            return
        self.update("  \u2502  ".join(parts))


class SloStrip(Static):
    DEFAULT_CSS = """
    SloStrip { height: auto; max-height: 3; background: $panel; color: $foreground; }
    """

    def update_from(self, width: int, eff: EfficiencyView | None = None,
                    selected: int = 0) -> None:
        if eff is None or not eff.jobs:
            proxy = (f" proxy from GPU utilization: [b]{eff.proxy:.2f}[/b] (proxy)"
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
            slis = {w: state.window(sec, now) for w, sec in WINDOWS.items()}
            sli_text = " ".join(
                f"{w} [b]{v[0]:.2f}[/b]" if v[0] is not None else f"{w} -"
                for w, v in slis.items())
            throughput = slis["1m"][1]
            scaling = eff.scaling_efficiency(state, throughput)
            sli_now = slis["1m"][0]
            ok = sli_now is not None and sli_now >= eff.slo.target
            sli_color = "$success" if ok else "$error"
            effic = (f"scaling efficiency [b]{scaling:.2f}[/b]" if scaling is not None else
                     (f"compute fraction [b]{sli_now:.2f}[/b] (no baseline)"
                      if sli_now is not None else "compute fraction -"))
            burn = state.burn.burn_rates(now) if state.burn else {}
            used = state.burn.consumed_hours if state.burn else 0.0
            left = eff.slo.remaining_hours(used)
            burn_text = " ".join(f"{w} {burn[w]:.1f}x" for w in ("5m", "1h")
                                 if burn.get(w) is not None)
            firing = state.burn.firing(now) if state.burn else []
            status = ("[$error]PAGE[/]" if any(f[0] == "page" for f in firing) else
                      "[$warning]TICKET[/]" if firing else "[$success]ok[/]")
            share = max(0.0, min(1.0, left / eff.slo.budget_hours))
            bar = "\u2588" * round(share * 10) + "\u2591" * (10 - round(share * 10))
            to_empty = eff.slo.hours_to_exhaustion(used, burn.get("1h") or 0.0)
            empty = f", empty in {to_empty:.0f} h" if to_empty is not None else ""
            mfu = eff.mfu(state, throughput)
            spark = sparkline(eff.sli_series(state, 30), 30, 1.0)
            which = f" [{selected + 1}/{len(jobs)}, J: next]" if len(jobs) > 1 else ""
            reporting = state.ranks_reporting(now, 60.0)
            ranks = (f"[$warning]{reporting} of {state.world} ranks[/]"
                     if reporting < state.world else
                     f"{state.world} rank{'s' if state.world != 1 else ''}")
            age = state.age(now)
            stale = age is not None and age > STALE_STEPS_S
            if stale:  # old inputs say so: no silent numbers from before the outage
                status = f"[$warning]no step reports for {age:.0f} s[/]"
            elif reporting < state.world and not firing:
                status = "[$warning]degraded[/]"  # a rank is silent: not "ok"
            line = (f" [b]{safe(state.job, 24)}[/b]{which} ({ranks})  "
                    f"[{sli_color}]SLI[/] [$heat-4]{spark}[/] {sli_text}  {effic}"
                    + (f"  MFU [b]{mfu:.2f}[/b]" if mfu is not None else "")
                    + (f"  {throughput:,.0f} samples/s" if throughput else "  - samples/s")
                    + f"  budget{_budget_scope(state.burn)} [$heat-4]{bar}[/] "
                    f"{left:.1f}/{eff.slo.budget_hours:.0f} h"
                    f"{empty}  burn {burn_text or '-'} {status}")
            if state.stragglers:
                s = state.stragglers[0]
                line += (f"  [$warning]straggler[/] {safe(s.node, 20)} x{s.ratio:.2f}"
                         + (f" +{len(state.stragglers) - 1} ranks"
                            if len(state.stragglers) > 1 else f" GPU {s.gpu}"))
            if width < 150:  # one short line: the numbers an on-call engineer needs first
                line = (f" [b]{safe(state.job, 16)}[/b] [{sli_color}]SLI[/] "
                        f"{sli_text.split('  ')[0]}  {left:.1f} h left  burn "
                        f"{burn_text.split(' ')[-1] if burn_text else '-'}"
                        + (f"  {status}" if stale or "PAGE" in status or "TICKET" in status
                           else ""))
            lines.append(line)
        self.update("\n".join(lines))


def _budget_scope(burn: object) -> str:
    """Whose count the budget is: the relay's ledger (the run) or this viewer's session."""
    if isinstance(burn, LedgerBurn):
        if burn.error:
            return " [$error](ledger not writing)[/]"
        return " (prometheus)" if burn.source == "prometheus" else " (run)"
    return " (session)"


class Legend(Static):
    DEFAULT_CSS = "Legend { height: 1; color: $foreground; }"

    def update_from(self, title: str, metric: HeatMetric, metrics: tuple[HeatMetric, ...],
                    cursor_text: str, width: int = 200) -> None:
        scale = "".join(f"[$heat-{i}]\u2588[/]" for i in range(9))
        if width < 160:  # the key list goes; the footer and `?` have the keys
            self.update(f" [b]{title}[/b] {metric.key} {metric.legend[0]} {scale} "
                        f"{metric.legend[1]} \u2502 {cursor_text}")
            return
        keys = " ".join(f"[b]{i + 1}[/b]:{m.key}" if m is not metric else
                        f"[reverse][b]{i + 1}[/b]:{m.key}[/]" for i, m in enumerate(metrics))
        self.update(f" [b]{title}[/b] {metric.label}  {metric.legend[0]} {scale} "
                    f"{metric.legend[1]}  [$error]\u2717[/] failed  \u2591 stale  \u00b7 n/a  "
                    f"\u2502 {keys}  \u2502 {cursor_text}")


class StoragePanel(Static):
    DEFAULT_CSS = """
    StoragePanel { height: auto; max-height: 8; border-top: solid $panel; color: $foreground; }
    """

    def update_from(self, storage: StorageView, width: int, compact: bool = False) -> None:
        if not storage.filesystems:
            self.update(" [b]storage[/b]  no shared file system reported by any node")
            return
        if compact or width < 120:
            self.update("\n".join(self._compact_line(storage, mount, fs, width)
                                  for mount, fs in sorted(storage.filesystems.items())))
            return
        spark_w = max(8, min(40, width - 110))
        lines = [" [b]storage[/b]  aggregate over nodes"]
        for mount, fs in sorted(storage.filesystems.items()):
            prov = storage.provisioned.get(mount)
            total = fs.read + fs.write
            share = (f"  [{'$error' if total > 0.9 * prov else '$foreground'}]"
                     f"{100 * total / prov:.0f}% of {rate(prov)} provisioned[/]" if prov else "")
            cap = (f"  {size(fs.size - fs.free)} / {size(fs.size)} used"
                   if fs.size and fs.free is not None else "")
            top = ", ".join(f"{safe(n, 16)} {rate(v)}" for n, v in fs.top_readers if v)
            writers = ", ".join(f"{safe(n, 16)} {rate(v)}" for n, v in fs.top_writers if v)
            lines.append(
                f"  [$accent]{safe(mount, 24):<24}[/] {fs.fstype:<6} "
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


class EventsPane(Static):
    DEFAULT_CSS = """
    EventsPane { height: auto; max-height: 9; border-top: solid $panel; color: $foreground; }
    """

    def update_from(self, cluster: ClusterState, rows: int, width: int = 200,
                    findings: list[Finding] | None = None) -> None:
        lines = []
        findings = findings or []
        if findings:
            shown = findings[: max(1, rows // 2 + 1)]
            more = f" (+{len(findings) - len(shown)} more)" if len(findings) > len(shown) else ""
            lines.append(f" [b]diagnosis[/b]  {len(findings)} finding(s), worst first{more}")
            for f in shown:
                color = SEVERITY.get(f.severity, "$foreground")
                text = safe(f.message, max(40, width - 14))
                lines.append(f"  [{color}]{f.severity:<8}[/] {text}")
            rows = max(1, rows - len(shown))
        if not cluster.events:
            lines.append(" [b]events[/b]  none yet")
            self.update("\n".join(lines))
            return
        lines.append(f" [b]events[/b]  newest first ({len(cluster.events)} kept)")
        for ev in list(cluster.events)[:rows]:
            color = SEVERITY.get(ev.severity, "$foreground")
            when = time.strftime("%H:%M:%S", time.localtime(ev.ts))
            if width < 120:
                lines.append(f" {when} [{color}]{ev.severity[:4]}[/] "
                             f"{safe(ev.message, max(20, width - 16))}")
            else:
                lines.append(f"  {when} [{color}]{ev.severity:<8}[/] {safe(ev.node, 20):<20} "
                             f"{safe(ev.message, 140)}")
        self.update("\n".join(lines))
