"""`tuimon`: watch a cluster (`connect`) or a simulated one (`demo`). The line is parsed
(tuimon.commands.parser, a `--cluster`'s settings as the defaults) and run by the
command's own module (tuimon.commands.*, tuimon.relay.command)."""

from __future__ import annotations

import sys
from types import ModuleType

from tuimon.app_log import log_to_file
from tuimon.commands import cluster as cluster_args
from tuimon.commands import connect, demo, prom, replay, report, rules, status
from tuimon.commands.parser import COMMANDS, build_parser
from tuimon.config import cluster_defaults, set_cluster_defaults
from tuimon.relay.command import run_relay
from tuimon_core.closed_pipe import quiet_on_closed_pipe
from tuimon_core.errors import UsageError
from tuimon_core.logs import log_to_stderr

# Each command's module, whose `run(args)` runs it (looked up when run).
RUNS: dict[str, ModuleType] = {"connect": connect, "status": status, "replay": replay,
                               "demo": demo, "prom": prom, "rules": rules, "report": report}


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
        return status.USAGE_EXIT if command == "status" else 2
    except KeyboardInterrupt:
        return 130


def _main(argv: list[str], parsed: dict[str, str]) -> int:
    parser = build_parser()
    cluster = cluster_args.cluster_of(argv)
    if cluster is not None:
        if not any(a in COMMANDS for a in argv):
            # `tuimon --cluster prod` watches that cluster, through Prometheus if that is
            # what the config file names for it.
            argv = cluster_args.implicit_command(argv, cluster)
        # The cluster's settings are the defaults: an option typed on the command line
        # always wins, whatever its value.
        set_cluster_defaults(parser, cluster_defaults(cluster))
    args = parser.parse_args(argv)
    parsed["command"] = args.command
    if cluster is not None:
        cluster_args.fill_targets(args, cluster)
    if args.command in ("connect", "prom", "demo", "replay") and not (
            getattr(args, "once", False) or getattr(args, "plain", False)
            or getattr(args, "serve", None)):
        log_to_file(args.log_file)
    else:  # the screen is the terminal's: warnings to standard error, cleaned
        log_to_stderr()
    if args.command == "relay":
        log_to_stderr(args.log_level)
        return run_relay(args)
    return RUNS[args.command].run(args)


if __name__ == "__main__":
    sys.exit(main())
