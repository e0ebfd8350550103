"""Both command lines: typed flags beat the config file whatever their value, usage
errors say what to type (exit 2, no traceback), bugs keep their traceback, `--version`,
`tuimon rules` through the real promtool, and `tuimon relay` (with the agent's alias)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import tuimon.cli
import tuimon.commands.status
from tuimon.cli import build_parser
from tuimon.config import cluster_defaults, load, set_cluster_defaults
from tuimon_core.version import __version__

ROOT = Path(__file__).resolve().parent.parent


def _cli(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True,
                          text=True, timeout=60, env=env, cwd=ROOT)


def _parse_with_config(tmp_path: Path, toml: str, argv: list[str]):  # type: ignore[no-untyped-def]
    f = tmp_path / "config.toml"
    f.write_text(toml)
    cluster = load(f)["lab"]
    parser = build_parser()
    set_cluster_defaults(parser, cluster_defaults(cluster))
    return parser.parse_args(argv)


def test_a_typed_flag_wins_even_when_it_equals_the_default(tmp_path: Path) -> None:
    toml = ('[clusters.lab]\ntargets = ["gpu001"]\nslo_target = 0.95\nslo_days = 7\n'
            'name = "the lab"\n[clusters.lab.baselines]\nllm = 30\n')
    # The default target is 0.90: typed, it must beat the file's 0.95.
    args = _parse_with_config(tmp_path, toml, ["status", "--slo-target", "0.9",
                                               "--slo-hours", "720", "--name", "cluster"])
    assert args.slo_target == 0.9 and args.slo_hours == 720.0 and args.name == "cluster"
    # Not typed: the file's values.
    args = _parse_with_config(tmp_path, toml, ["status"])
    assert args.slo_target == 0.95 and args.slo_hours == 7 * 24 and args.name == "the lab"
    # Lists add to the file's.
    args = _parse_with_config(tmp_path, toml, ["connect", "--baseline", "bert=12"])
    assert args.baseline == ["llm=30.0", "bert=12"]


def test_the_config_file_does_not_configure_the_relay(tmp_path: Path) -> None:
    # A cluster's token file is the agents' token; for a relay --token-file is the one
    # its viewers send: the cluster must not slip it in.
    toml = '[clusters.lab]\ntargets = ["gpu001"]\ntoken_file = "/etc/agents.token"\n'
    args = _parse_with_config(tmp_path, toml, ["relay", "gpu001"])
    assert args.token_file is None
    args = _parse_with_config(tmp_path, toml, ["connect"])
    assert args.token_file == "/etc/agents.token"


@pytest.mark.parametrize("module,args,expected", [
    ("tuimon.cli", ["connect", "--every", "0", "h"], "argument --every: must be in (0, 3600]"),
    ("tuimon.cli", ["replay", "--speed", "-1", "f"], "argument --speed: must be in (0, 10000]"),
    ("tuimon.cli", ["status", "--slo-target", "90", "h"], "must be between 0 and 1"),
    ("tuimon.cli", ["demo", "--nodes", "0"], "argument --nodes: must be in 1..10000"),
    ("tuimon.cli", ["prom", "http://p:9090", "--every", "0.1"], "must be in [0.5, 3600]"),
    ("tuimon.cli", ["replay", "/nonexistent/recording"], "/nonexistent/recording: no such "),
    ("tuimon.cli", ["rules", "--match", "not a matcher"], "not a PromQL label matcher"),
    ("agent", ["once", "--interval", "0"], "argument --interval: must be in [0.01, 3600]"),
    ("agent", ["run", "--token-file", "/nonexistent/token"], "/nonexistent/token"),
    ("agent", ["sim", "--speed", "0"], "argument --speed: must be in (0, 3600]"),
    ("agent", ["sim", "--speed", "5000"], "argument --speed: must be in (0, 3600]"),
    ("agent", ["sim", "--nodes", "10", "--base-port", "65530"], "lower --base-port"),
    ("agent", ["sim", "--nodes", "2", "--truth", "/nonexistent/dir/t.json"],
     "--truth /nonexistent/dir/t.json: cannot write"),
    ("tuimon.cli", ["demo", "--nodes", "10001"], "argument --nodes: must be in 1..10000"),
    ("tuimon.cli", ["connect", "--tls", "--tls-ca", "/nonexistent/ca.pem", "h", "--once"],
     "--tls-ca /nonexistent/ca.pem: cannot load the CA certificates"),
    ("tuimon.cli", ["relay", "--interval", "120", "h"],
     "argument --interval: must be in [0.05, 60]"),
    ("tuimon.cli", ["relay", "--no-ledger"], "the relay needs at least one target"),
    ("tuimon.cli", ["prom", "http://p:9090", "--json"], "--json goes with --once"),
    ("tuimon.cli", ["prom", "http://p:9090", "--tenant", "a\r\nX-Evil: 1", "--once"],
     "argument --tenant: 'a\\r\\nX-Evil: 1': expected 1 to 256 visible ASCII"),
    ("tuimon.cli", ["status", "--prometheus", "http://p:9090", "--tenant", "t\x1b[2J"],
     "argument --tenant:"),
])
def test_usage_errors_say_what_to_type_without_a_traceback(module: str, args: list[str],
                                                          expected: str) -> None:
    out = _cli(module, *args)
    # status is a monitoring check: its usage error is UNKNOWN (3), its 2 is critical.
    assert out.returncode == (3 if args[0] == "status" else 2), (out.returncode, out.stderr)
    assert expected in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("module,args,first,hint", [
    ("tuimon.cli", ["connect", "--nodez", "gpu1"],
     "tuimon connect: unrecognized arguments: --nodez (did you mean --nodes?)",
     "try 'tuimon connect --help'"),
    ("tuimon.cli", ["status", "--watch", "soon"],
     "tuimon status: argument --watch: invalid float value: 'soon'",
     "try 'tuimon status --help'"),
    ("agent", ["run", "--intervl", "2"],
     "tuimon-agent run: unrecognized arguments: --intervl 2 (did you mean --interval?)",
     "try 'tuimon-agent run --help'"),
])
def test_a_usage_error_is_one_line_and_where_the_help_is(module: str, args: list[str],
                                                       first: str, hint: str) -> None:
    """Not the ten-line usage block in front of the line that matters: the line, the
    closest option when one is misspelt, and where the help is."""
    out = _cli(module, *args)
    assert out.returncode == (3 if args[0] == "status" else 2), out.returncode
    assert out.stderr.splitlines() == [first, hint], out.stderr


def test_a_host_list_of_100000_agents_is_taken_but_said() -> None:
    import contextlib
    import io

    from tuimon.commands.connection import connect_options

    args = build_parser().parse_args(["connect", "gpu[1-100000]:9477"])
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        targets, _, _ = connect_options(args)
    assert len(targets) == 100_000
    assert "watching 100,000 agents directly" in err.getvalue()
    assert "relay" in err.getvalue() and args.notes  # the app says it on screen too
    args = build_parser().parse_args(["connect", "gpu[1-64]:9477"])
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        connect_options(args)
    assert err.getvalue() == ""


def test_debug_shows_the_traceback_of_a_usage_error() -> None:
    out = _cli("tuimon.cli", "--debug", "replay", "/nonexistent/recording")
    assert out.returncode == 1 and "Traceback" in out.stderr
    assert "RecordingError" in out.stderr


def test_a_bug_keeps_its_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(args: object) -> int:
        raise KeyError("a bug, not a usage error")

    monkeypatch.setattr(tuimon.commands.status, "run", broken)
    with pytest.raises(KeyError):
        tuimon.cli.main(["status", "127.0.0.1:1"])


@pytest.mark.parametrize("module,name", [("tuimon.cli", "tuimon"), ("agent", "tuimon-agent")])
def test_version(module: str, name: str) -> None:
    out = _cli(module, "--version")
    assert out.returncode == 0 and out.stdout.strip() == f"{name} {__version__}"


def test_rules_from_the_command_line_load_in_promtool(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("CI") == "true":
            pytest.fail("promtool is missing under CI: .ci/run installs prometheus")
        pytest.skip("promtool not installed (apt-get install prometheus; CI installs it)")
    target = tmp_path / "tuimon.yml"
    out = _cli("tuimon.cli", "rules", "--slo-target", "0.95", "--slo-days", "30",
               "--match", 'cluster="prod"', "-o", str(target))
    assert out.returncode == 0, out.stderr
    text = target.read_text()
    assert "SLO target 0.95" in text and 'cluster="prod"' in text
    check = subprocess.run([promtool, "check", "rules", str(target)], capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    # 12 SLI records, 2 wait shares, 4 alerts and TuimonFinding (every finding held)
    assert "SUCCESS: 19 rules found" in check.stdout


def test_the_relay_is_tuimon_relay_and_the_agents_alias_runs_it() -> None:
    for module, args in (("tuimon.cli", ["relay", "--help"]), ("agent", ["relay", "--help"])):
        out = _cli(module, *args)
        assert out.returncode == 0, out.stderr
        assert "usage: tuimon relay" in out.stdout and "--ledger" in out.stdout


def test_the_relay_never_takes_a_clusters_targets(tmp_path: Path) -> None:
    """`tuimon --cluster lab relay` with no targets: the cluster's agents (and its relay,
    perhaps this very one) are what a viewer watches, not what this relay fans in."""
    f = tmp_path / "config.toml"
    f.write_text('[clusters.lab]\ntargets = ["127.0.0.1:9"]\nrelay = "127.0.0.1:9"\n')
    out = _cli("tuimon.cli", "--config", str(f), "--cluster", "lab", "relay", "--no-ledger",
               "--listen", "127.0.0.1:0")
    assert out.returncode == 2 and "the relay needs at least one target" in out.stderr


@pytest.mark.parametrize("key", ["slo_hours = 0", "slo_days = -3"])
def test_a_non_positive_slo_window_in_the_config_is_named(tmp_path: Path, key: str) -> None:
    f = tmp_path / "config.toml"
    f.write_text(f'[clusters.lab]\ntargets = ["h"]\n{key}\n')
    out = _cli("tuimon.cli", "--config", str(f), "--cluster", "lab", "status")
    assert out.returncode == 3 and "Traceback" not in out.stderr  # status: UNKNOWN
    assert f"{f}:3: clusters.lab.{key.split()[0]}: must be a positive number" in out.stderr


def test_node_aliases_in_the_config_are_accepted(tmp_path: Path) -> None:
    toml = ('[clusters.lab]\nprometheus = "http://p:9090"\n'
            '[clusters.lab.node_aliases]\n"10.0.0.5" = "gpu005"\n')
    args = _parse_with_config(tmp_path, toml, ["prom", "http://p:9090"])
    assert args.node_alias == ["10.0.0.5=gpu005"]


def test_debug_is_taken_before_or_after_the_relay_command() -> None:
    assert build_parser().parse_args(["relay", "h", "--debug"]).debug is True
    assert build_parser().parse_args(["--debug", "relay", "h"]).debug is True
    assert build_parser().parse_args(["relay", "h"]).debug is False


def test_a_gpu_less_simulation_is_allowed() -> None:
    assert build_parser().parse_args(["demo", "--gpus", "0"]).gpus == 0


def test_a_reader_that_stops_reading_ends_the_command_quietly() -> None:
    """`tuimon rules | head -1`: the pipe closes before the text is written; the command
    ends as Unix tools do (141, as for SIGPIPE) with nothing on stderr, not with two
    BrokenPipe tracebacks and 0."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([sys.executable, "-m", "tuimon.cli", "rules"], cwd=ROOT, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout is not None and p.stderr is not None
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 141 and err == "", err


def test_a_broken_pipe_that_is_not_stdout_keeps_its_traceback() -> None:
    """Only a reader gone from standard output is a quiet 141: a broken pipe of a socket
    or a child (stdout still read) is a fault, raised with its traceback."""
    from tuimon_core.closed_pipe import quiet_on_closed_pipe

    def broken() -> int:
        raise BrokenPipeError(32, "Broken pipe (a socket)")

    with pytest.raises(BrokenPipeError):
        quiet_on_closed_pipe(broken)
