"""`tuimon prom` at fleet scale: a real Prometheus (or VictoriaMetrics) scraping N GPU
nodes' dcgm-exporter and node_exporter series (bench/prom_fleet.py: about 300 series a
node), and the app reading it; the fleet laid out as each `--layout` says (one target
per node, `instance` naming it; one target for all, labels naming each node; one
target per node, some with one exporter only), each measured in turn.

Measured, each in its own process, side by side in one run:
  - `tuimon prom URL --once`: wall time and CPU (median of 3);
  - the app (`TuimonApp` on a pseudo-terminal of 200x50, refreshing every `--every` s):
    its CPU share over the window, the time from each refresh's first query to the
    screen that shows it (p50, p95), and the bytes of the server's answers per refresh;
  - the server's and the fleet's own CPU over the same window, beside it.

    .venv/bin/python bench/prom.py [--nodes 1024 4096] [--seconds 60] [--every 5]
        [--layout instance labels mixed]

A table per layout: a row per node count.

Targets (issue #26, and #43 for every layout): at 4096 nodes x 8 GPUs through a real
Prometheus at a 5 s refresh, the app <= 15 % of a core, each refresh on screen within
2 s of its query, `--once` <= 3 s wall; at 1024 nodes <= 5 %; the bytes per refresh
reported.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import pty
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from prom_fleet import LAYOUTS, scrape_configs, targets  # noqa: E402
from tui import _cpu_s, _rss_mib, drain  # noqa: E402


def _app(url: str, every: float, seconds: float, warmup: float, out: Path,
         recorded: bool) -> None:
    from tuimon.model.cluster import ClusterState
    from tuimon.sources.prometheus import PromOptions, PromSource, prom_watching
    from tuimon.ui.app import TuimonApp

    refreshes: list[dict[str, float]] = []
    pending: list[float] = []  # refreshes applied, not yet on screen: their start
    on_screen: list[float] = []
    t_start = time.time()
    original = PromSource.refresh

    read_bytes: dict[str, float] = {}  # the source's bytes (beside the refreshes too)

    async def refresh(self: PromSource) -> None:
        started, before = time.time(), self.bytes_read
        await original(self)
        if started >= t_start + warmup:
            read_bytes.setdefault("from", before)
            read_bytes.setdefault("since", started)
            read_bytes["to"], read_bytes["until"] = self.bytes_read, time.time()
            # A refresh that found the records as they were (--recorded) brings nothing
            # to show: counted apart, with the bytes of its one small query.
            refreshes.append({"s": time.time() - started, "bytes": self.bytes_read - before,
                              "read": self.last_refresh_read})
            if self.last_refresh_read:
                pending.append(started)

    PromSource.refresh = refresh  # type: ignore[method-assign]

    class MeasuredApp(TuimonApp):
        def on_mount(self) -> None:
            self.set_timer(warmup + seconds, self.exit)

        def _shown(self) -> None:
            if pending:
                now = time.time()
                on_screen.extend(now - t for t in pending)
                pending.clear()

        def draw(self, read: bool = False) -> bool:
            drew = super().draw(read)
            if drew:
                self._shown()
            return drew

        def _redraw_maps(self) -> None:
            # The once-a-second tick draws the changed lines too; the draw between ticks
            # then stands aside, so counting only it would add up to a second.
            super()._redraw_maps()
            self._shown()

    def sources(state: ClusterState) -> list[Any]:
        async def run() -> None:
            async with prom_watching(url, state, PromOptions(every=every, timeout=30.0,
                                                             recorded=recorded)):
                await asyncio.Event().wait()
        return [run()]

    app = MeasuredApp(ClusterState("bench"), sources=sources, refresh=1.0)
    if os.environ.get("TUIMON_BENCH_PROFILE"):  # where the app's time goes
        import cProfile

        cProfile.runctx("app.run()", globals(), {"app": app},
                        os.environ["TUIMON_BENCH_PROFILE"])
    else:
        app.run()
    out.write_text(json.dumps({"refreshes": refreshes, "on_screen": on_screen,
                               "bytes_per_s": (read_bytes["to"] - read_bytes["from"]) / max(
                                   1e-9, read_bytes["until"] - read_bytes["since"])
                               if read_bytes else None,
                               "nodes_up": app.cluster.counts()}))


def _query(url: str, promql: str) -> float:
    with urllib.request.urlopen(f"{url}/api/v1/query?" + urllib.parse.urlencode(
            {"query": promql, "nocache": "1"}), timeout=60) as r:
        result = json.load(r)["data"]["result"]
    return float(result[0]["value"][1]) if result else 0.0


def _once(url: str, env: dict[str, str], recorded: bool) -> dict[str, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", "import sys; from tuimon.cli import main; "
                           "sys.exit(main())", "prom", url, "--once", "--timeout", "60",
                           *(["--recorded"] if recorded else [])],
                          env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if "nodes" not in done.stdout:  # a readout always says how the nodes stand
        raise RuntimeError(f"--once failed ({done.returncode}): {done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu}


def _measure(nodes: int, seconds: float, warmup: float, every: float, scrape: float,
             server: str, recorded: bool, layout: str = "instance") -> dict[str, Any]:
    from tests.peers import free_port, running_prometheus, running_victoria_metrics
    from tuimon.sources.prom_live_rules import inventory_name, live_rules_yaml, record_name

    tmp = Path(tempfile.mkdtemp(prefix="tuimon-prom-bench-"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    port = free_port()
    ready = tmp / "fleet.ready"
    if server == "victoria-metrics":
        if recorded:
            raise SystemExit("--recorded: VictoriaMetrics single-node evaluates no rules "
                             "(vmalert does)")
        run = running_victoria_metrics
    else:
        def run(tmp: Path, configs: str, every: float) -> Any:
            return running_prometheus(tmp, configs, every,
                                      rules=live_rules_yaml(every=every) if recorded else "")
    fleet = subprocess.Popen([sys.executable, str(ROOT / "bench" / "prom_fleet.py"),
                              str(nodes), "--port", str(port), "--ready", str(ready),
                              "--layout", layout],
                             env=env, cwd=ROOT)
    try:
        while not ready.exists():
            if fleet.poll() is not None:
                raise RuntimeError("the fleet server did not start")
            time.sleep(0.2)
        with run(tmp, scrape_configs(nodes, port, layout), every=scrape) as url:
            deadline = time.monotonic() + 600
            while _query(url, 'count(up{job="fleet"} == 1)') < targets(nodes, layout):
                if time.monotonic() > deadline:
                    raise RuntimeError("the server did not scrape every node in 10 min")
                time.sleep(scrape)
            time.sleep(3 * scrape)  # two scrapes of every node: rates are defined
            # (not count({__name__=~".+"}): VictoriaMetrics refuses a selection that wide)
            series = _query(url, "sum(scrape_samples_scraped)")
            server_pid = int(subprocess.run(
                ["pgrep", "-n", "-f", "prometheus --config" if server == "prometheus"
                 else "victoria-metrics -httpListenAddr"],
                capture_output=True, text=True).stdout.split()[0])
            if recorded:  # the records of every node evaluated at least once
                for record in (record_name("gpu"), inventory_name("gpu_info")):
                    while _query(url, f"count({record})") < nodes * 8:
                        time.sleep(scrape)
            once = [_once(url, env, recorded) for _ in range(3)]
            out = tmp / "app.json"
            pid, fd = pty.fork()
            if pid == 0:
                os.environ.update(env, TERM="xterm-256color", COLUMNS="200", LINES="50")
                os.execv(sys.executable, [sys.executable, __file__, "--app", url,
                                          "--every", str(every), "--seconds", str(seconds),
                                          "--warmup", str(warmup), "--out", str(out),
                                          *(["--recorded"] if recorded else [])])
            t_start = time.monotonic()
            procs = {"app": pid, "server": server_pid, "fleet": fleet.pid}
            m: dict[str, Any] = {}

            def tick(_: int) -> None:
                if "start" not in m and time.monotonic() - t_start >= warmup:
                    m["start"] = {name: _cpu_s(p) for name, p in procs.items()}
                    m["t0"] = time.monotonic()
                elif "start" in m:
                    with contextlib.suppress(OSError):
                        m.update(end={name: _cpu_s(p) for name, p in procs.items()},
                                 t_end=time.monotonic(),
                                 rss=max(m.get("rss", 0.0), _rss_mib(pid)))  # 0 once ended

            tail = drain(fd, tick)
            os.waitpid(pid, 0)
            if "t_end" not in m or not out.exists():
                raise RuntimeError("the app ended early; its terminal said: "
                                   + tail.decode(errors="replace")[-2000:])
            result = json.loads(out.read_text())
            groups = _rule_groups(url) if recorded and server == "prometheus" else {}
    finally:
        fleet.send_signal(signal.SIGTERM)
        fleet.wait(15)
    window = m["t_end"] - m["t0"]
    share = {name: (m["end"][name] - m["start"][name]) / window for name in m["end"]}
    shown = sorted(result["on_screen"])
    read = [r for r in result["refreshes"] if r["read"]]
    return {
        "nodes": nodes, "layout": layout, "server": server, "recorded": recorded,
        "series": series,
        "every": every,
        "scrape": scrape,
        "once_wall_s": statistics.median(o["wall_s"] for o in once),
        "once_cpu_s": statistics.median(o["cpu_s"] for o in once),
        "app_cpu_share": share["app"],
        "app_rss_mib": m["rss"],
        "server_cpu_share": share["server"],
        "fleet_cpu_share": share["fleet"],
        "refreshes": len(result["refreshes"]),
        "refreshes_read": len(read),
        "refresh_s_p50": statistics.median(r["s"] for r in read) if read else None,
        "on_screen_p50": shown[len(shown) // 2] if shown else None,
        "on_screen_p95": shown[int(len(shown) * 0.95)] if shown else None,
        "bytes_per_refresh": statistics.median(r["bytes"] for r in read) if read else None,
        "bytes_per_s": result["bytes_per_s"],
        "nodes_up": result["nodes_up"]["up"],
        "rule_groups_s": groups,
    }


def _rule_groups(url: str) -> dict[str, float]:
    """Each rule group's last evaluation, in seconds of the server's time: what the
    records cost it, once per interval whoever looks (from its own /metrics)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("prometheus_rule_group_last_duration_seconds{"):
            labels, value = line.rsplit(" ", 1)
            group = labels.split('rule_group="', 1)[1].split('"', 1)[0].rsplit(";", 1)[-1]
            out[group] = float(value)
    return out


def _table(layout: str, rows: list[dict[str, Any]], every: float) -> None:
    """The runs of one layout, a row per node count."""
    if not rows:
        return
    head = ("nodes", "series", "once s", "once CPU s", f"app % @{every:g}s", "MiB",
            "refresh s", "screen p50", "screen p95", "MB/refresh", "up", "server %",
            "fleet %")
    body = [(f"{r['nodes']}", f"{r['series']:,.0f}", f"{r['once_wall_s']:.1f}",
             f"{r['once_cpu_s']:.1f}", f"{100 * r['app_cpu_share']:.1f}",
             f"{r['app_rss_mib']:.0f}", f"{r['refresh_s_p50']:.2f}",
             f"{r['on_screen_p50']:.2f}", f"{r['on_screen_p95']:.2f}",
             f"{r['bytes_per_refresh'] / 1e6:.1f}", f"{r['nodes_up']}",
             f"{100 * r['server_cpu_share']:.0f}", f"{100 * r['fleet_cpu_share']:.0f}")
            for r in rows]
    widths = [max(len(c) for c in col) for col in zip(head, *body)]
    print(f"\n{layout} layout ({rows[0]['server']}"
          f"{', --recorded' if rows[0]['recorded'] else ''}):")
    for line in (head, *body):
        print("  ".join(c.rjust(w) for c, w in zip(line, widths)), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--nodes", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--layout", nargs="+", choices=LAYOUTS, default=["instance"],
                    help="how the fleet's nodes are scraped (bench/prom_fleet.py): each "
                         "given is measured in turn")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--warmup", type=float, default=20.0)
    ap.add_argument("--every", type=float, default=5.0, help="the app's refresh (s)")
    ap.add_argument("--scrape", type=float, default=5.0,
                    help="the server's scrape interval (s); raise it where two cores cannot "
                         "carry the server's ingest beside the app")
    ap.add_argument("--server", choices=["prometheus", "victoria-metrics"],
                    default="prometheus")
    ap.add_argument("--recorded", action="store_true",
                    help="load `tuimon rules --live` into Prometheus (evaluated at the scrape "
                         "interval) and run the app with --recorded")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--app", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.server == "victoria-metrics" and "labels" in args.layout:
        ap.error("--layout labels: VictoriaMetrics refuses a scrape over its "
                 "-promscrape.maxScrapeSize (16 MiB), and the one target's is about 45 MB "
                 "at 1024 nodes")
    if args.app:
        _app(args.app, args.every, args.seconds, args.warmup, Path(args.out), args.recorded)
        return
    rows = []
    for n in args.nodes:
        for layout in args.layout:
            r = _measure(n, args.seconds, args.warmup, args.every, args.scrape, args.server,
                         args.recorded, layout)
            rows.append(r)
            if not r["refreshes_read"]:
                print(f"{n} nodes, {layout} layout: no refresh read values in "
                      f"{args.seconds:g} s (records never evaluated again?): run longer",
                      flush=True)
                continue
            print(f"{n} nodes, {layout} layout ({r['series']:,.0f} series, {args.server}"
                  f"{' with the live rules' if args.recorded else ''} scraping every "
                  f"{r['scrape']:g} s): --once {r['once_wall_s']:.1f} s wall, "
                  f"{r['once_cpu_s']:.1f} s CPU; app {100 * r['app_cpu_share']:.1f} % of a "
                  f"core at a {args.every:g} s refresh ({r['app_rss_mib']:.0f} MiB), refresh "
                  f"{r['refresh_s_p50']:.2f} s, on screen p50 {r['on_screen_p50']:.2f} s p95 "
                  f"{r['on_screen_p95']:.2f} s, {r['bytes_per_refresh'] / 1e6:.1f} MB read "
                  f"per refresh ({r['refreshes_read']} of {r['refreshes']} refreshes read "
                  f"values{', so p95 is of few' if r['refreshes_read'] < 20 else ''}; "
                  f"{r['bytes_per_s'] / 1e6:.2f} MB/s in all); "
                  f"{r['nodes_up']} nodes up; server "
                  f"{100 * r['server_cpu_share']:.0f} %, fleet {100 * r['fleet_cpu_share']:.0f} %"
                  + "".join(f"; rule group {group}: {s:.2f} s an evaluation"
                            for group, s in r["rule_groups_s"].items()),
                  flush=True)
    for layout in args.layout:
        _table(layout, [r for r in rows if r["layout"] == layout and r["refreshes_read"]],
               args.every)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
