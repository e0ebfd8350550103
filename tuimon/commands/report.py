"""`tuimon report --relay R --job J`: one job's run as a document for a review, read
from the relay that keeps its ledger: Markdown, or one self-contained HTML file."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from tuimon.commands.connection import relay_of
from tuimon.commands.options import tls_options
from tuimon.model.judge_config import add_slo_options
from tuimon.model.slo import Slo
from tuimon_core.cli_types import duration
from tuimon_core.errors import UsageError
from tuimon_core.protocol.text import clean
from tuimon_core.user_files import write_file

# The formats, and the suffixes of -o that choose them.
FORMATS = ("markdown", "html")
SUFFIXES = {".md": "markdown", ".markdown": "markdown", ".html": "html", ".htm": "html"}


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--relay", metavar="HOST[:PORT]",
                   help="the relay that keeps the run's ledger (default port 9478)")
    p.add_argument("--job", metavar="NAME", required=True, help="the job to report on")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="write here instead of stdout (the format from its suffix: "
                        ".md or .html)")
    p.add_argument("--format", choices=FORMATS,
                   help="markdown (the default on stdout) or html")
    p.add_argument("--since", type=duration, metavar="DURATION",
                   help="the SLI and the incidents over the last DURATION (6h, 2d; "
                        "default: the ledger's whole window); the budget is the run's")
    tls_options(p, "the relay", "the relay's")
    add_slo_options(p, jobs=False)


def run(args: argparse.Namespace) -> int:
    """The relay's report of the job, as a document."""
    from tuimon.model.run_report import ReportError, run_report
    from tuimon.sources.relay_history import HistoryError, read_report
    from tuimon.status import EXIT
    from tuimon.ui.report_html import report_html
    from tuimon.ui.report_markdown import report_markdown

    form = args.format
    if form is None and args.output:
        form = SUFFIXES.get(Path(args.output).suffix.lower())
        if form is None:
            raise UsageError(f"--output {args.output}: give --format markdown or html (the "
                             "suffix, .md or .html, says neither)")
    relay, options = relay_of(args)
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
