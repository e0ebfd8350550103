"""`tuimon rules`: Prometheus recording and burn-rate alerting rules for the training SLO
(the app's windows and thresholds), or with `--live` the recording rules of `tuimon prom
--recorded`."""

from __future__ import annotations

import argparse
import sys

from tuimon.commands.prom_query import node_labels
from tuimon.model.slo import DEFAULT_HOURS, DEFAULT_TARGET, Slo
from tuimon_core.cli_types import positive_float, slo_target
from tuimon_core.errors import UsageError
from tuimon_core.user_files import write_file


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--slo-target", type=slo_target, default=DEFAULT_TARGET,
                   help="SLO target for the effective training time ratio (default "
                        f"{DEFAULT_TARGET:.2f})")
    window = p.add_mutually_exclusive_group()
    window.add_argument("--slo-hours", type=positive_float(1e6), default=DEFAULT_HOURS,
                        help="SLO window in hours: the run's planned hours (default "
                             f"{DEFAULT_HOURS:.0f})")
    window.add_argument("--slo-days", type=positive_float(36500.0), metavar="DAYS",
                        help="SLO window in days (rolling), instead of --slo-hours")
    p.add_argument("--job-label", default="exported_job", metavar="LABEL",
                   help="the label holding the training job's name (default "
                        "exported_job: Prometheus renames the agent's `job` on a clash)")
    p.add_argument("--match", default="", metavar="MATCHERS",
                   help="label matchers for one cluster, e.g. 'cluster=\"prod\"' (kept "
                        "on the records and alerts, so one file per cluster)")
    p.add_argument("--live", action="store_true",
                   help="write instead the recording rules of `tuimon prom --recorded`: "
                        "the live queries, evaluated once per interval on the server, "
                        "and the inventory's, once a minute")
    p.add_argument("--every", type=positive_float(60.0, least=1.0), default=5.0,
                   metavar="S",
                   help="with --live: the rules' evaluation interval in seconds, 1 to "
                        "60 (default 5; the scrape interval is the most worth having)")
    p.add_argument("--node-label", action="append", default=[], metavar="LABEL",
                   help="with --live: a label that names the node, as given to tuimon "
                        "prom; repeatable")
    p.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")


def run(args: argparse.Namespace) -> int:
    from tuimon.model.prom_rules import rules_yaml

    hours = args.slo_days * 24.0 if args.slo_days else args.slo_hours
    try:
        if args.live:
            from tuimon.sources.prom_live_rules import live_rules_yaml

            node_labels(args.node_label)
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
