"""`tuimon`: watch a cluster (`connect`) or a simulated one (`demo`)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import re
import ssl
import sys
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from agent.sim.limits import MAX_GPUS, MAX_NODES
from agent.sim.scenarios import add_scenario_options
from tuimon.app_log import log_to_file
from tuimon.config import ClusterConfig, cluster_defaults, set_cluster_defaults
from tuimon.manual import SECTIONS as MANUAL_SECTIONS
from tuimon.model import judge_config
from tuimon.model.cluster import ClusterState
from tuimon.model.judge_config import (
    JudgeConfig,
    add_judge_options,
    add_slo_options,
    slo_of,
)
from tuimon.model.slo import DEFAULT_HOURS, DEFAULT_TARGET, Slo
from tuimon.prom_judge_command import judge_options, serve_flags_alone
from tuimon.readout import ROW_READS, render
from tuimon.relay.command import add_relay_options, run_relay
from tuimon.snapshot_waits import WAITS
from tuimon.sources.agent_stream import StreamOptions, watching
from tuimon.sources.targets import (
    TargetError,
    expand_hostlists,
    parse_targets,
    read_targets_file,
)
from tuimon_core.cli_docs import add_doc_options, complete_from
from tuimon_core.cli_parser import Parser
from tuimon_core.cli_types import (
    duration,
    header_value,
    positive_float,
    positive_int,
    slo_target,
)
from tuimon_core.closed_pipe import quiet_on_closed_pipe
from tuimon_core.errors import UsageError
from tuimon_core.logs import log_to_stderr
from tuimon_core.protocol import Subscribe
from tuimon_core.protocol.overview_layout import OVERVIEW_FORM
from tuimon_core.protocol.text import clean
from tuimon_core.serving.security import (
    check_token_transport,
    client_ssl_context,
    load_token,
)
from tuimon_core.user_files import write_file
from tuimon_core.version import __version__


def _target_options(p: argparse.ArgumentParser) -> None:
    """Where the agents are and how to reach them: shared by connect and status."""
    p.add_argument("targets", nargs="*", metavar="TARGET",
                   help="agents: host[:port], Slurm host lists allowed: gpu[001-128]:9477")
    p.add_argument("--relay", action="append", default=[], metavar="HOST[:PORT]",
                   help="a relay (default port 9478), which may speak for the nodes it "
                        "carries; repeatable")
    p.add_argument("--targets-file", metavar="F", help="one target per line")
    _tls_options(p, "the agents", "the agents'")
    p.add_argument("--name", default="cluster", help="cluster name shown in the header")
    p.add_argument("--nodes", metavar="HOSTLIST", action="append",
                   help="through a relay: only these nodes (Slurm host list; repeatable)")
    p.add_argument("--families", metavar="LIST",
                   help="only these families, comma-separated: gpu,host,fabric,storage,steps,"
                        "events")
    p.add_argument("--every", type=positive_float(3600.0), metavar="S",
                   help="ask for samples at most every S seconds (slower links)")
    p.add_argument("--full-frames", action="store_true",
                   help="the app: take every value of every node, not each node's overview "
                        "(the open node always comes whole); costs ~20x the bytes and CPU")
    add_judge_options(p)


def _tls_options(p: argparse.ArgumentParser, whom: str, whose: str) -> None:
    """The token and TLS a viewer reaches agents or a relay with."""
    p.add_argument("--token-file", metavar="F", help=f"bearer token for {whom}")
    p.add_argument("--tls", action="store_true", help="connect with TLS (wss://, https://)")
    p.add_argument("--insecure", action="store_true",
                   help="send the token over plain HTTP to non-loopback targets anyway")
    p.add_argument("--tls-ca", metavar="F", help=f"CA bundle that signed {whose} "
                   "certificates")
    p.add_argument("--tls-insecure", action="store_true",
                   help=f"do not verify {whose} certificates")


def _theme_option(p: argparse.ArgumentParser) -> None:
    action = p.add_argument("--theme", help="theme name (t cycles them in the app): the "
                            "packaged ones and the user's own files")
    complete_from(action, _theme_names)


def _theme_names() -> list[str]:
    from tuimon.ui.theme_files import load_themes  # Textual: only when a script is printed

    return sorted({t.name for t in load_themes()[0]})


def _view_options(p: argparse.ArgumentParser) -> None:
    """How to show what arrives: shared by connect and demo."""
    p.add_argument("--once", action="store_true",
                   help="print one readout after the first samples and exit with the "
                        "verdict, as `tuimon status`: 0 ok, 1 warning, 2 critical")
    p.add_argument("--plain", action="store_true",
                   help="print a text readout every second instead of the full-screen app")
    _theme_option(p)
    p.add_argument("--record", metavar="FILE",
                   help="write every frame as received (gzip, msgpack) for replay")
    _ascii_option(p)
    _log_option(p)


def _ascii_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ascii", action="store_true", default=None,
                   help="draw with ASCII only (the default where the locale, LC_ALL, "
                        "LC_CTYPE or LANG, is not UTF-8: C, POSIX, a serial console)")


def _prom_query_options(p: argparse.ArgumentParser) -> None:
    """What to ask a Prometheus server and how to name its nodes: prom and status."""
    p.add_argument("--match", default="", metavar="MATCHERS",
                   help="Prometheus: label matchers added to every query, e.g. "
                        "'cluster=\"prod\"'")
    p.add_argument("--node-label", action="append", default=[], metavar="LABEL",
                   help="Prometheus: a label that names the node, tried before the built-in "
                        "order (node, kubernetes_node, Hostname, node_exporter's uname, the "
                        "instance's host); repeatable")
    p.add_argument("--node-alias", action="append", default=[], metavar="NAME=NODE",
                   help="Prometheus: call what resolves to NAME by NODE instead (e.g. an "
                        "exporter's address); repeatable")
    p.add_argument("--timeout", type=positive_float(600.0), default=10.0, metavar="S",
                   help="Prometheus: seconds each query may take (default 10); a slow "
                        "answer to the live queries fails the refresh, to the others is "
                        "asked again at the next one")
    p.add_argument("--tenant", metavar="ID", type=header_value,
                   help="Prometheus: the tenant to ask (sent as X-Scope-OrgID, as Grafana "
                        "Mimir and Cortex require)")
    p.add_argument("--recorded", action="store_true",
                   help="Prometheus: read the records of `tuimon rules --live` (loaded on "
                        "the server, same --match and --node-label) instead of evaluating "
                        "the live queries at every refresh")


def _log_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--log-file", metavar="FILE",
                   help="the full-screen app's log: warnings and internal errors with their "
                        "tracebacks (default $XDG_STATE_HOME/tuimon/tuimon.log)")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="tuimon", description="Live monitor for GPU "
                                     "training clusters.")
    parser.add_argument("--version", action="version", version=f"tuimon {__version__}")
    add_doc_options(parser, MANUAL_SECTIONS)
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of any error, usage errors too")
    parser.add_argument("--cluster", metavar="NAME",
                        help="a cluster from the config file (alone: connect to it)")
    parser.add_argument("--config", metavar="FILE",
                        help="config file (default $XDG_CONFIG_HOME/tuimon/config.toml)")
    sub = parser.add_subparsers(dest="command", required=True)
    connect = sub.add_parser("connect", help="watch agents or a relay: host[:port], "
                                             "gpu[001-128]:PORT, login1:9478")
    _target_options(connect)
    _view_options(connect)
    add_slo_options(connect)
    prom = sub.add_parser("prom", help="watch the cluster through Prometheus (or Thanos, "
                                       "Mimir, VictoriaMetrics): agent, dcgm-exporter and "
                                       "node_exporter metrics")
    prom.add_argument("url", help="the server's base URL, e.g. http://prometheus:9090")
    prom.add_argument("--token-file", metavar="F", help="bearer token for the server")
    prom.add_argument("--tls-ca", metavar="F", help="CA bundle for an https:// server")
    prom.add_argument("--tls-insecure", action="store_true",
                      help="do not verify the server's certificate")
    prom.add_argument("--insecure", action="store_true",
                      help="send the token over plain http:// to a non-loopback server anyway")
    _prom_query_options(prom)
    prom.add_argument("--every", type=positive_float(3600.0, least=0.5), default=5.0,
                      metavar="S",
                      help="seconds between refreshes (default 5)")
    prom.add_argument("--name", default="cluster", help="cluster name shown in the header")
    add_judge_options(prom)
    prom.add_argument("--json", action="store_true",
                      help="with --once: print the document `tuimon status --json` prints "
                           "(and exit with its codes: 0 ok, 1 warning, 2 critical, 3 unknown)")
    _view_options(prom)
    add_slo_options(prom)
    judge_options(prom)
    rep = sub.add_parser("replay", help="play a recording back in the app: space pauses, "
                                        ". steps, [ ] seek a minute, + - speed")
    rep.add_argument("file")
    rep.add_argument("--speed", type=positive_float(10000.0), default=1.0,
                     help="seconds of the recording per second (default 1)")
    _theme_option(rep)
    rep.add_argument("--topology", metavar="F",
                     help="Slurm topology.conf: group the recording's nodes by leaf switch")
    _ascii_option(rep)
    _log_option(rep)
    status = sub.add_parser("status", help="no screen: one snapshot (or --watch), exit code "
                                           "0 ok / 1 warning / 2 critical / 3 unknown",
                            usage_exit=STATUS_USAGE_EXIT,
                            description=f"One snapshot of the cluster, or a watch. {WAITS} "
                                        "Exit code 0 ok, 1 warning, 2 critical, 3 unknown "
                                        "(a usage error too: the check, not the cluster, is "
                                        "wrong).")
    _target_options(status)
    status.add_argument("--watch", type=float, default=0.0, metavar="SECONDS",
                        help="keep watching this long; the exit code is the worst seen")
    status.add_argument("--json", action="store_true",
                        help="print the snapshot as JSON (the same figures as the text)")
    status.add_argument("--job", metavar="NAME",
                        help="one job whole, as its screen (b) shows it: budget spent by "
                             "kind, waits, ranks, nodes, findings (exit code: the cluster's)")
    status.add_argument("--since", type=duration, metavar="DURATION",
                        help="through relays: the incidents their judgement held over the "
                             "last DURATION (6h, 2d), newest first, with what each cost; "
                             "with --job, those that touched its nodes")
    status.add_argument("--prometheus", metavar="URL",
                        help="check the cluster through this Prometheus server (as `tuimon "
                             "prom` watches it) instead of its agents")
    _prom_query_options(status)
    add_slo_options(status)
    demo = sub.add_parser("demo", help="simulate a cluster on loopback and watch it")
    demo.add_argument("--nodes", type=positive_int(MAX_NODES), default=32,
                      help=f"simulated nodes (default 32, at most {MAX_NODES})")
    demo.add_argument("--gpus", type=positive_int(MAX_GPUS, least=0), default=8,
                      help=f"GPUs a node (default 8, at most {MAX_GPUS}; 0: CPU-only nodes)")
    demo.add_argument("--seed", type=int, default=0,
                      help="the simulation's random seed: one seed, one run (default 0)")
    demo.add_argument("--base-port", type=int, default=19400, metavar="P",
                      help="node i listens on 127.0.0.1:(P+i) (default 19400)")
    _view_options(demo)
    add_slo_options(demo)
    add_scenario_options(demo)
    rules = sub.add_parser("rules", help="write Prometheus recording and burn-rate alerting "
                                         "rules for the training SLO (the app's windows and "
                                         "thresholds)")
    rules.add_argument("--slo-target", type=slo_target, default=DEFAULT_TARGET,
                       help="SLO target for the effective training time ratio (default "
                            f"{DEFAULT_TARGET:.2f})")
    window = rules.add_mutually_exclusive_group()
    window.add_argument("--slo-hours", type=positive_float(1e6), default=DEFAULT_HOURS,
                        help="SLO window in hours: the run's planned hours (default "
                             f"{DEFAULT_HOURS:.0f})")
    window.add_argument("--slo-days", type=positive_float(36500.0), metavar="DAYS",
                        help="SLO window in days (rolling), instead of --slo-hours")
    rules.add_argument("--job-label", default="exported_job", metavar="LABEL",
                       help="the label holding the training job's name (default "
                            "exported_job: Prometheus renames the agent's `job` on a clash)")
    rules.add_argument("--match", default="", metavar="MATCHERS",
                       help="label matchers for one cluster, e.g. 'cluster=\"prod\"' (kept "
                            "on the records and alerts, so one file per cluster)")
    rules.add_argument("--live", action="store_true",
                       help="write instead the recording rules of `tuimon prom --recorded`: "
                            "the live queries, evaluated once per interval on the server, "
                            "and the inventory's, once a minute")
    rules.add_argument("--every", type=positive_float(60.0, least=1.0), default=5.0,
                       metavar="S",
                       help="with --live: the rules' evaluation interval in seconds, 1 to "
                            "60 (default 5; the scrape interval is the most worth having)")
    rules.add_argument("--node-label", action="append", default=[], metavar="LABEL",
                       help="with --live: a label that names the node, as given to tuimon "
                            "prom; repeatable")
    rules.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    report = sub.add_parser(
        "report", help="one job's run as a document for a review, from a relay's ledger: "
                       "the SLI over the run, the budget by kind and cause, the incidents, "
                       "the slowest nodes and leaves, the fleet's differences",
        description="One job's run as a document a review starts from, read from the "
                    "relay that keeps its ledger (GET /v1/report): Markdown for a ticket, "
                    "or one self-contained HTML file with the plots drawn in it. The "
                    "budget is the run's, under --slo-target and --slo-hours as `status "
                    "--job` has it. Exit code 0, 2 for a usage error, 3 (unknown) when the "
                    "relay cannot be read or counts no such job.")
    report.add_argument("--relay", metavar="HOST[:PORT]",
                        help="the relay that keeps the run's ledger (default port 9478)")
    report.add_argument("--job", metavar="NAME", required=True, help="the job to report on")
    report.add_argument("-o", "--output", metavar="FILE",
                        help="write here instead of stdout (the format from its suffix: "
                             ".md or .html)")
    report.add_argument("--format", choices=REPORT_FORMATS,
                        help="markdown (the default on stdout) or html")
    report.add_argument("--since", type=duration, metavar="DURATION",
                        help="the SLI and the incidents over the last DURATION (6h, 2d; "
                             "default: the ledger's whole window); the budget is the run's")
    _tls_options(report, "the relay", "the relay's")
    add_slo_options(report, jobs=False)
    relay = sub.add_parser("relay", help="fan in many agents (or relays), fan out batches to "
                                         "viewers, keep the run's SLO ledger")
    add_relay_options(relay)
    return parser


# More agents than this watched directly (no relay) is said before it is done.
MANY_DIRECT = 8192
COMMANDS = ("connect", "status", "replay", "demo", "prom", "relay", "rules", "report")
# A monitoring check's usage error is UNKNOWN (3): its 2 means critical.
STATUS_USAGE_EXIT = 3
# `tuimon report`'s formats, and the suffixes of -o that choose them.
REPORT_FORMATS = ("markdown", "html")
REPORT_SUFFIXES = {".md": "markdown", ".markdown": "markdown", ".html": "html",
                   ".htm": "html"}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    parsed: dict[str, str] = {}  # the command, once the line is parsed
    try:
        return quiet_on_closed_pipe(lambda: _main(argv, parsed))
    except UsageError as exc:  # what the user typed or configured: no traceback
        if debug:
            raise
        print(f"tuimon: {exc}", file=sys.stderr)
        # (an error before the line is parsed: a config file's, a cluster's name)
        command = parsed.get("command") or next((a for a in argv if a in COMMANDS), None)
        return STATUS_USAGE_EXIT if command == "status" else 2
    except KeyboardInterrupt:
        return 130


def _main(argv: list[str], parsed: dict[str, str]) -> int:
    parser = build_parser()
    cluster = _cluster_of(argv)
    if cluster is not None:
        if not any(a in COMMANDS for a in argv):
            # `tuimon --cluster prod` watches that cluster, through Prometheus if that is
            # what the config file names for it.
            argv = _implicit_command(argv, cluster)
        # The cluster's settings are the defaults: an option typed on the command line
        # always wins, whatever its value.
        set_cluster_defaults(parser, cluster_defaults(cluster))
    args = parser.parse_args(argv)
    parsed["command"] = args.command
    if cluster is not None:
        _fill_targets(args, cluster)
    if args.command in ("connect", "prom", "demo", "replay") and not (
            getattr(args, "once", False) or getattr(args, "plain", False)
            or getattr(args, "serve", None)):
        log_to_file(args.log_file)
    else:  # the screen is the terminal's: warnings to standard error, cleaned
        log_to_stderr()
    if args.command == "demo":
        if args.once or args.plain:
            return asyncio.run(_demo(args))
        return _demo_app(args)
    if args.command == "status":
        return _status(args)
    if args.command == "replay":
        return _replay(args)
    if args.command == "prom":
        return _prom(args)
    if args.command == "rules":
        return _rules(args)
    if args.command == "report":
        return _report(args)
    if args.command == "relay":
        log_to_stderr(args.log_level)
        return run_relay(args)
    if args.once or args.plain:
        return asyncio.run(_connect(args))
    return _connect_app(args)


def _rules(args: argparse.Namespace) -> int:
    from tuimon.model.prom_rules import rules_yaml

    hours = args.slo_days * 24.0 if args.slo_days else args.slo_hours
    try:
        if args.live:
            from tuimon.sources.prom_live_rules import live_rules_yaml

            _node_labels(args.node_label)
            text = live_rules_yaml(args.match, args.node_label, args.every)
        else:
            text = rules_yaml(Slo(args.slo_target, hours), job_label=args.job_label,
                              selector=args.match)
    except ValueError as exc:
        raise UsageError(f"rules: {exc}") from None
    if not args.output:
        sys.stdout.write(text)
        return 0
    write_file(args.output, text, "--output")
    return 0


def _report(args: argparse.Namespace) -> int:
    """`tuimon report --relay R --job J`: the relay's report of the job, as a document."""
    from tuimon.model.run_report import ReportError, run_report
    from tuimon.sources.relay_history import HistoryError, read_report
    from tuimon.status import EXIT
    from tuimon.ui.report_html import report_html
    from tuimon.ui.report_markdown import report_markdown

    form = args.format
    if form is None and args.output:
        form = REPORT_SUFFIXES.get(Path(args.output).suffix.lower())
        if form is None:
            raise UsageError(f"--output {args.output}: give --format markdown or html (the "
                             "suffix, .md or .html, says neither)")
    relay, options = _relay_of(args)
    try:
        report = run_report(asyncio.run(read_report(relay, options, args.job, args.since)),
                            Slo(args.slo_target, args.slo_hours))
    except ReportError as exc:
        print(clean(f"tuimon: UNKNOWN: relay {relay}: its report does not read: {exc}"),
              file=sys.stderr)
        return EXIT["unknown"]
    except HistoryError as exc:  # unreachable, refused, no ledger, no such job
        print(clean(f"tuimon: UNKNOWN: {exc}"), file=sys.stderr)
        return EXIT["unknown"]
    text = report_html(report) if form == "html" else report_markdown(report)
    if args.output:
        write_file(args.output, text, "--output")
    else:
        sys.stdout.write(text)
    return 0


def _replay(args: argparse.Namespace) -> int:
    from tuimon.sources.recording import ReplayControl, read_recording, replay
    from tuimon.ui.app import ReplayApp

    rec = read_recording(args.file)
    control = ReplayControl(speed=args.speed)
    # Ages on the recording's clock: a node silent in the recording goes stale and down
    # as it did live, at the replay's pace, and not while it is paused.
    cluster = ClusterState(f"replay of {rec.name or args.file}",
                           clock=lambda: control.position)
    ReplayApp(cluster, control, rec.duration,
              sources=lambda state: [replay(rec, state, control)], theme=args.theme,
              topology=judge_config.topology(args.topology), damage=rec.damage,
              ascii_only=args.ascii,
              wall=lambda: rec.started + control.position).run()
    if rec.damage:
        print(f"tuimon: {args.file}: {rec.damage}", file=sys.stderr)
    return 0


Recorder = Callable[[str, bytes], None]
# How a viewer gets its data: given the model and an optional recorder, a context in
# which the model is kept up to date (agents or a relay via `watching`, or Prometheus).
Feed = Callable[[ClusterState, "Recorder | None"], AbstractAsyncContextManager[Any]]


def _agent_feed(targets: list[str], options: StreamOptions,
                relays: list[str] | None = None) -> Feed:
    def feed(state: ClusterState, recorder: Recorder | None) -> AbstractAsyncContextManager[Any]:
        opts = dataclasses.replace(options, recorder=recorder) if recorder else options
        return watching(targets, state, opts, relays=relays or [])
    return feed


def _run_app(cluster: ClusterState, feed: Feed,
             theme: str | None, topology: dict[str, str], provisioned: dict[str, float],
             slo: tuple[Slo, dict[str, float], dict[str, float]],
             before: Callable[[], Awaitable[None]] | None = None,
             after: Callable[[], Awaitable[None]] | None = None,
             record: str | None = None,
             wall: Callable[[], float] | None = None,
             cpu_nodes: frozenset[str] = frozenset(),
             ascii_only: bool | None = None, notes: list[str] | None = None,
             history: Callable[[float], Awaitable[list[dict[str, Any]]]] | None = None) -> int:
    from tuimon.sources.recording import RecordingWriter
    from tuimon.ui.app import TuimonApp

    writer = RecordingWriter(record, cluster.name) if record else None
    if writer is not None:
        cluster.recorder = writer.call

    def sources(state: ClusterState) -> list[Coroutine[Any, Any, None]]:
        async def run_all() -> None:
            if before is not None:
                await before()
            try:
                async with feed(state, writer.write if writer is not None else None):
                    await asyncio.Event().wait()  # until the app cancels this task
            finally:
                if after is not None:
                    await after()
        return [run_all()]

    try:
        TuimonApp(cluster, sources=sources, theme=theme, topology=topology,
                  provisioned=provisioned, slo=slo[0], baselines=slo[1],
                  flops_per_sample=slo[2], wall=wall, cpu_nodes=cpu_nodes,
                  ascii_only=ascii_only, notes=notes, history=history).run()
    finally:
        if writer is not None:
            writer.close()
            print(f"tuimon: recorded {writer.frames} frames to {writer.path}")
    return 0


async def _watch(cluster: ClusterState, feed: Feed, once: bool, judge: Any,
                 record: str | None = None) -> int:
    from tuimon.sources.recording import RecordingWriter

    writer = RecordingWriter(record, cluster.name) if record else None
    if writer is not None:
        cluster.recorder = writer.call
    try:
        return await _print_loop(cluster, feed, once, judge,
                                 writer.write if writer else None)
    finally:
        if writer is not None:
            writer.close()


async def _print_loop(cluster: ClusterState, feed: Feed, once: bool, judge: Any,
                      recorder: Recorder | None) -> int:
    from tuimon.status import first_samples

    cluster.set_drawn(ROW_READS)  # what the readout shows of every node
    async with feed(cluster, recorder):
        if once:
            # What a one-shot status waits for, so it says what the app says.
            await first_samples(cluster, judge.efficiency)
            return await _print_once(cluster, judge)
        while True:
            judge.update()
            screen = render(cluster, judge=judge)
            sys.stdout.write("\x1b[H\x1b[2J" + screen + "\n" if sys.stdout.isatty()
                             else screen + "\n\n")
            sys.stdout.flush()
            await asyncio.sleep(1.0)


def _connect_options(args: argparse.Namespace) -> tuple[list[str], list[str], StreamOptions]:
    """(agents, relays, how to reach them)."""
    from tuimon_core.ports import DEFAULT_RELAY_PORT

    items = list(args.targets)
    if args.targets_file:
        items += read_targets_file(args.targets_file)
    # `http://host:port` (as a browser or curl would have it) means host:port; https and
    # wss mean TLS too.
    if any(str(i).startswith(("https://", "wss://")) for i in [*items, *args.relay]):
        args.tls = True
    items = [_strip_scheme(i) for i in items]
    targets = parse_targets(items)
    relays = parse_targets([_strip_scheme(r) for r in args.relay], DEFAULT_RELAY_PORT)
    if not targets and not relays:
        raise TargetError("no targets: give host[:port] arguments, --relay HOST or "
                          "--targets-file" + (", or --prometheus URL"
                                              if args.command == "status" else ""))
    if len(targets) > MANY_DIRECT:
        # Taken, but said: a typo in a host list (`gpu[1-100000]`) or a cluster that
        # wants a relay in front of it.
        note = (f"watching {len(targets):,} agents directly: each is a connection and a "
                f"frame a second to this viewer; beyond a few thousand put a relay in front "
                f"(tuimon relay) and give --relay")
        print(f"tuimon: {note}", file=sys.stderr)
        args.notes = [*getattr(args, "notes", []), note]  # and the app says it on screen
    token, ssl_ctx = _credentials(args, [*targets, *relays])
    subscribe = None
    if args.nodes or args.families or args.every:
        families = ([f.strip() for f in args.families.split(",") if f.strip()]
                    if args.families else None)
        expand_hostlists(args.nodes or [])  # a bad host list is an error here, not on the relay
        subscribe = Subscribe(interval=args.every, families=families, nodes=args.nodes,
                              overview_form=OVERVIEW_FORM)
    return targets, relays, StreamOptions(token=token, ssl_context=ssl_ctx,
                                          subscribe=subscribe)


def _credentials(args: argparse.Namespace, addresses: list[str]
                 ) -> tuple[str | None, ssl.SSLContext | None]:
    """The token and TLS context the options give, checked against where they go (no
    token in clear text off loopback)."""
    token = load_token(args.token_file) if args.token_file else None
    ssl_ctx = (client_ssl_context(args.tls_ca, args.tls_insecure)
               if args.tls or args.tls_ca or args.tls_insecure else None)
    check_token_transport(addresses, token, ssl_ctx is not None, args.insecure)
    return token, ssl_ctx


def _relay_of(args: argparse.Namespace) -> tuple[str, StreamOptions]:
    """The one relay `--relay` names (host:port), and how to reach it."""
    from tuimon_core.ports import DEFAULT_RELAY_PORT

    if not args.relay:
        raise TargetError(f"{args.command}: give --relay HOST[:PORT], the relay that keeps "
                          "the run's ledger")
    if args.relay.startswith(("https://", "wss://")):
        args.tls = True
    relays = parse_targets([_strip_scheme(args.relay)], DEFAULT_RELAY_PORT)
    if len(relays) != 1:
        raise TargetError(f"--relay {args.relay!r}: one relay, HOST[:PORT]")
    token, ssl_ctx = _credentials(args, relays)
    return relays[0], StreamOptions(token=token, ssl_context=ssl_ctx)


def _strip_scheme(item: str) -> str:
    for scheme in ("https://", "http://", "wss://", "ws://"):
        if item.startswith(scheme):
            return item[len(scheme):].split("/", 1)[0]
    return item


def _cluster_of(argv: list[str]) -> ClusterConfig | None:
    """The cluster named by --cluster (and --config), read before the real parse so that
    its settings can be the parser's defaults."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--cluster")
    pre.add_argument("--config")
    known, _ = pre.parse_known_args(argv)
    if not known.cluster:
        return None
    from tuimon import config

    path = Path(known.config).expanduser() if known.config else None
    if path is not None and not path.exists():
        raise TargetError(f"--config {known.config}: file not found")
    clusters = config.load(path)
    if known.cluster not in clusters:
        names = ", ".join(sorted(clusters)) or "none"
        raise TargetError(f"no cluster {known.cluster!r} in "
                          f"{path or config.default_path()} (clusters: {names})")
    return clusters[known.cluster]


def _implicit_command(argv: list[str], cluster: ClusterConfig) -> list[str]:
    """The global options, then the command the cluster's config implies, then the rest
    (which are that command's options)."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--cluster")
    pre.add_argument("--config")
    pre.add_argument("--debug", action="store_true")
    known, rest = pre.parse_known_args(argv)
    front = ["--cluster", known.cluster] + (["--config", known.config] if known.config
                                            else []) + (["--debug"] if known.debug else [])
    if cluster.prometheus and not (cluster.targets or cluster.relay):
        return [*front, "prom", cluster.prometheus, *rest]
    return [*front, "connect", *rest]


def _fill_targets(args: argparse.Namespace, c: ClusterConfig) -> None:
    """Targets typed on the command line replace the cluster's targets and relay; with
    none typed, the cluster's are used."""
    if args.command == "report":
        args.relay = args.relay or c.relay  # the ledger a cluster's relay keeps
        return
    if args.command not in ("connect", "status"):
        return  # the relay has its own targets; the config file describes what you watch
    if not args.targets and not args.relay and not getattr(args, "prometheus", None):
        args.targets = list(c.targets)
        args.relay = [c.relay] if c.relay else []
        if args.command == "status" and not (args.targets or args.relay) and c.prometheus:
            args.prometheus = c.prometheus  # a cluster watched through Prometheus





def _status(args: argparse.Namespace) -> int:
    from tuimon.status import EXIT, run_status

    if getattr(args, "job", None) and args.watch:
        raise TargetError("--job is one snapshot of the job: without --watch")
    if getattr(args, "since", None) is not None:  # (`prom --json` has no --since)
        return _status_history(args)
    feed = None
    if args.prometheus:
        from tuimon.sources.prometheus import prom_watching

        if args.targets or args.relay:
            raise TargetError("status: give agents, relays or --prometheus, not both")
        args.url, args.every = args.prometheus, 1.0
        prom_options = _prom_options(args)
        if not args.watch:  # a snapshot: the ports' error counters read once count nothing
            prom_options = dataclasses.replace(prom_options, errors_every=None)
        targets: list[str] = []
        relays: list[str] = []
        options = StreamOptions()

        def feed(state: ClusterState) -> AbstractAsyncContextManager[Any]:
            return prom_watching(args.prometheus, state, prom_options)
    else:
        targets, relays, options = _connect_options(args)
    slo, baselines, _ = slo_of(args)
    topology = judge_config.topology(args.topology, getattr(args, "leaves", None))
    try:
        return asyncio.run(run_status(targets, options, relays=relays, watch=args.watch,
                                      topology=topology,
                                      provisioned=judge_config.provisioned(args.provisioned),
                                      slo=slo,
                                      baselines=baselines, as_json=args.json, name=args.name,
                                      cpu_nodes=judge_config.cpu_nodes(args), feed=feed,
                                      job=getattr(args, "job", None)))
    except BrokenPipeError:
        raise  # the reader went away (`| head -1`): not the check's fault (closed_pipe)
    except Exception as exc:
        # A bug in the check is no verdict on the cluster: UNKNOWN, as a monitoring
        # system expects of a check that failed, with the traceback for the report.
        import traceback

        traceback.print_exc(file=sys.stderr)
        print(clean(f"UNKNOWN: internal error in tuimon status: {type(exc).__name__}: "
                    f"{exc}"[:300]), flush=True)
        return EXIT["unknown"]


def _status_history(args: argparse.Namespace) -> int:
    """`status --relay R --since 6h`: the incidents the relays' judgement held."""
    from tuimon.status import EXIT, print_history

    targets, relays, options = _connect_options(args)
    if targets or args.prometheus or not relays:
        raise TargetError("--since reads the history a relay keeps: give --relay only")
    return EXIT[asyncio.run(print_history(relays, options, args.since, args.job, args.json))]


def _connect_app(args: argparse.Namespace) -> int:
    targets, relays, options = _connect_options(args)
    # The app draws the cluster from overviews and opens a node whole (`status` and the
    # readout print every node's values; --families asks for exactly what it says).
    if not args.families and not args.full_frames:
        options = dataclasses.replace(options, overview=True)
    topology = judge_config.topology(args.topology, getattr(args, "leaves", None))
    cluster = ClusterState(args.name)
    for t in [*targets, *relays]:
        cluster.add_target(t)
    return _run_app(cluster, _agent_feed(targets, options, relays), args.theme, topology,
                    judge_config.provisioned(args.provisioned), slo_of(args), record=args.record,
                    cpu_nodes=judge_config.cpu_nodes(args), ascii_only=args.ascii,
                    notes=getattr(args, "notes", None),
                    history=_history(relays, options) if relays else None)


def _history(relays: list[str], options: StreamOptions) -> Callable[[float], Awaitable[
        list[dict[str, Any]]]]:
    """The relays' incidents over the last `seconds`, newest first (the history screen)."""
    from tuimon.sources.relay_history import read_history

    async def read(seconds: float) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        for relay in relays:
            found += (await read_history(relay, options, since=seconds))["incidents"]
        return sorted(found, key=lambda i: -i["onset"])
    return read


async def _prom_once(args: argparse.Namespace, cluster: ClusterState) -> int:
    """One refresh, printed; Prometheus failing is an error (exit 2), not an empty table."""
    from tuimon.sources.prometheus import PromError, PromSource
    from tuimon.sources.recording import RecordingWriter

    # One refresh: the ports' error counters read once would count nothing.
    options = dataclasses.replace(_prom_options(args), errors_every=None)
    writer = RecordingWriter(args.record, cluster.name) if args.record else None
    if writer is not None:
        options = dataclasses.replace(options, recorder=writer.write)
        cluster.recorder = writer.call
    judge = JudgeConfig.from_args(args).judgement(cluster)
    cluster.set_drawn(ROW_READS)  # what the readout shows of every node
    try:
        async with aiohttp.ClientSession() as session:
            await PromSource(args.url, cluster, session, options).refresh()
    except PromError as exc:
        print(f"tuimon: {exc}", file=sys.stderr)
        return 2
    finally:
        if writer is not None:
            writer.close()
    return await _print_once(cluster, judge)


async def _print_once(cluster: ClusterState, judge: Any) -> int:
    """The readout of `--once`, with the verdict `tuimon status` would give as its exit
    code: a condition seen but not yet held long enough is waited for, as status waits,
    so the text, `--once --json` and status name the same findings."""
    from tuimon.status import EXIT, settle, snapshot_findings, verdict

    if cluster.relayed_findings() is None:  # (a relay's come held from their onsets)
        await settle(judge)
    findings = snapshot_findings(judge, cluster, final=True)
    print(render(cluster, max_rows=10_000, judge=judge, findings=findings))
    return EXIT[verdict(cluster, findings)]


def _node_labels(labels: list[str]) -> None:
    for label in labels:
        # It goes into every query's `by (...)`: a name PromQL takes unquoted.
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", label):
            raise TargetError(f"--node-label {label!r}: expected a label name of letters, "
                              "digits and underscores (relabel it so on the server)")


def _prom_options(args: argparse.Namespace) -> Any:
    from tuimon.sources.prometheus import PromOptions

    if not args.url.startswith(("http://", "https://")):
        raise TargetError(f"prometheus URL {args.url!r}: expected http://HOST:PORT or "
                          "https://...")
    ssl_ctx = (client_ssl_context(args.tls_ca, args.tls_insecure)
               if args.tls_ca or args.tls_insecure else None)
    _node_labels(args.node_label)
    match = args.match
    from tuimon.sources.prom_live_rules import selector

    try:  # as PromQL reads it inside braces, given with them or not
        match = selector(args.match)
    except ValueError as exc:
        if args.recorded:  # the records are selected by the labels it names
            raise TargetError(f"--match with --recorded: {exc}") from None
    aliases = {}
    for item in args.node_alias:
        name, sep, node = item.partition("=")
        if not sep or not name or not node:
            raise TargetError(f"--node-alias {item!r}: expected NAME=NODE")
        aliases[name] = node
    token = load_token(args.token_file) if args.token_file else None
    if args.url.startswith("http://"):
        # The same rule as for agents and relays: no token in clear off loopback.
        server = urlsplit(args.url).netloc.rsplit("@", 1)[-1]
        check_token_transport([server], token, False, args.insecure,
                              tls_flag="an https:// URL")
    return PromOptions(token=token, tenant=args.tenant, timeout=args.timeout,
                       ssl_context=ssl_ctx, match=match, every=args.every,
                       slo_hours=args.slo_hours, node_labels=list(args.node_label),
                       node_aliases=aliases, recorded=args.recorded)


def _prom_feed(args: argparse.Namespace) -> Feed:
    from tuimon.sources.prometheus import prom_watching

    options = _prom_options(args)

    def feed(state: ClusterState, recorder: Recorder | None) -> AbstractAsyncContextManager[Any]:
        return prom_watching(args.url, state, dataclasses.replace(options, recorder=recorder))
    return feed


def _prom(args: argparse.Namespace) -> int:
    if args.serve:
        # No screen: the judgement served on /metrics until stopped (tuimon.prom_judge).
        from tuimon.prom_judge_command import run_prom_judge

        if args.once or args.json or args.plain or args.record:
            raise TargetError("--serve judges until stopped and draws nothing: without "
                              "--once, --json, --plain or --record")
        log_to_stderr("info")
        return run_prom_judge(args, _prom_options(args), JudgeConfig.from_args(args))
    alone = serve_flags_alone(args)
    if alone:
        raise TargetError(f"{', '.join(alone)}: options of --serve, which was not given")
    if args.json:
        if not args.once:
            raise TargetError("--json goes with --once (one document); the app and --plain "
                              "draw for people")
        # One document, the status check's, through the same Prometheus queries.
        args.prometheus, args.targets, args.relay, args.watch = args.url, [], [], 0.0
        return _status(args)
    feed = _prom_feed(args)
    cluster = ClusterState(args.name)
    if args.once:
        return asyncio.run(_prom_once(args, cluster))
    if args.plain:
        judge = JudgeConfig.from_args(args).judgement(cluster)
        return asyncio.run(_watch(cluster, feed, args.once, judge, args.record))
    topology = judge_config.topology(args.topology, getattr(args, "leaves", None))
    return _run_app(cluster, feed, args.theme, topology,
                    judge_config.provisioned(args.provisioned), slo_of(args), record=args.record,
                    cpu_nodes=judge_config.cpu_nodes(args), ascii_only=args.ascii)


def _demo_ports(args: argparse.Namespace) -> None:
    from agent.sim.cluster import free_port_block

    base = free_port_block("127.0.0.1", args.base_port, args.nodes)
    if base != args.base_port:
        print(f"tuimon demo: ports {args.base_port}-{args.base_port + args.nodes - 1} are in "
              f"use (another demo?); the simulated nodes listen on {base}-"
              f"{base + args.nodes - 1}", file=sys.stderr)
        args.base_port = base


def _demo_app(args: argparse.Namespace) -> int:
    from agent.sim.cluster import SimCluster
    from agent.sim.io_model import LUSTRE_MOUNT

    _demo_ports(args)
    sim = SimCluster(nodes=args.nodes, gpus=args.gpus, base_port=args.base_port, seed=args.seed,
                     scenario=args.scenario, fault_at=args.fault_at, speed=args.speed)
    if args.truth:
        write_file(args.truth, json.dumps(sim.truth(), indent=2) + "\n", "--truth")
    topology = {m.name: sim.leaf_of(m.index) for m in sim.members}
    slo = slo_of(args)
    cluster = ClusterState(f"demo: {args.nodes} simulated nodes")
    for t in sim.targets:
        cluster.add_target(t)
    return _run_app(cluster, _agent_feed(sim.targets, StreamOptions(overview=True)),
                    args.theme, topology,
                    {LUSTRE_MOUNT: sim.lustre_provisioned}, slo, before=sim.start,
                    after=sim.stop, record=args.record, wall=sim.wall,
                    ascii_only=args.ascii)


async def _connect(args: argparse.Namespace) -> int:
    targets, relays, options = _connect_options(args)
    cluster = ClusterState(args.name)
    return await _watch(cluster, _agent_feed(targets, options, relays), args.once,
                        JudgeConfig.from_args(args).judgement(cluster), args.record)


async def _demo(args: argparse.Namespace) -> int:
    from agent.sim.cluster import SimCluster

    _demo_ports(args)
    cluster = SimCluster(nodes=args.nodes, gpus=args.gpus, base_port=args.base_port,
                         seed=args.seed, scenario=args.scenario, fault_at=args.fault_at,
                         speed=args.speed)
    async with cluster:
        state = ClusterState(f"demo ({args.nodes} simulated nodes)")
        args.leaves = {}
        judge = JudgeConfig.from_args(args).judgement(state, wall=cluster.wall)
        judge.diagnosis.topology = {m.name: cluster.leaf_of(m.index) for m in cluster.members}
        return await _watch(state, _agent_feed(cluster.targets, StreamOptions()), args.once,
                            judge)


if __name__ == "__main__":
    sys.exit(main())
