"""Shell completion and the manual pages, generated from the parsers: what a user gets
from `eval "$(tuimon --print-completion bash)"` and `tuimon --print-man | man -l -`."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent.cli import build_parser as agent_parser
from tuimon.cli import COMMANDS
from tuimon.cli import build_parser as viewer_parser

ROOT = Path(__file__).resolve().parent.parent
CLIS = {"tuimon": [sys.executable, "-m", "tuimon.cli"],
        "tuimon-agent": [sys.executable, "-m", "agent"]}
needs_groff = pytest.mark.skipif(
    shutil.which("groff") is None and os.environ.get("CI") != "true",
    reason="groff is not installed here (.ci/run installs groff-base)")


def run(prog: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLIS[prog], *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=60)


def complete(script: str, func: str, words: list[str]) -> list[str]:
    """What bash offers for the last word, through the generated completion function."""
    line = " ".join(words)
    shell = (f"{script}\nCOMP_WORDS=({' '.join(repr(w) for w in words)})\n"
             f"COMP_CWORD={len(words) - 1}\nCOMP_LINE={line!r}\nCOMP_POINT={len(line)}\n"
             f"{func} {words[0]} {words[-1]!r} {words[-2]!r}\n"
             'printf "%s\\n" "${COMPREPLY[@]}"\n')
    out = subprocess.run(["bash", "--norc", "--noprofile"], input=shell, capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_bash_completes_tuimons_commands_options_and_choices() -> None:
    script = run("tuimon", "--print-completion", "bash").stdout
    assert "complete" in script and "_shtab_tuimon" in script
    assert set(complete(script, "_shtab_tuimon", ["tuimon", ""])) >= set(COMMANDS)
    assert complete(script, "_shtab_tuimon", ["tuimon", "st"]) == ["status"]
    assert "--slo-target" in complete(script, "_shtab_tuimon", ["tuimon", "status", "--slo"])
    assert "spine-imbalance" in complete(script, "_shtab_tuimon",
                                         ["tuimon", "demo", "--scenario", "sp"])
    assert "--job-label" in complete(script, "_shtab_tuimon", ["tuimon", "rules", "--j"])
    # --theme completes to the themes there are: the packaged ones...
    assert complete(script, "_shtab_tuimon", ["tuimon", "demo", "--theme", "tuimon-v"]) == [
        "tuimon-viridis"]


def test_theme_completion_offers_the_users_own_themes(tmp_path: Path) -> None:
    """...and a theme file the user dropped in their themes folder, by its name."""
    mine = tmp_path / "tuimon" / "themes"
    mine.mkdir(parents=True)
    packaged = (ROOT / "themes" / "dark.toml").read_text()
    (mine / "mine.toml").write_text(packaged.replace('name = "tuimon-dark"',
                                                     'name = "night-shift"'))
    script = subprocess.run([*CLIS["tuimon"], "--print-completion", "bash"],
                            capture_output=True, text=True, cwd=ROOT, timeout=60,
                            env={**os.environ, "XDG_CONFIG_HOME": str(tmp_path)}).stdout
    assert complete(script, "_shtab_tuimon", ["tuimon", "connect", "--theme", "ni"]) == [
        "night-shift"]


def test_bash_completes_the_agent() -> None:
    script = run("tuimon-agent", "--print-completion", "bash").stdout
    func = "_shtab_tuimon_agent"
    assert func in script
    assert set(complete(script, func, ["tuimon-agent", ""])) >= {"run", "once", "sim", "relay"}
    assert "--token-file" in complete(script, func, ["tuimon-agent", "run", "--tok"])


def test_zsh_and_tcsh_scripts_are_written() -> None:
    assert run("tuimon", "--print-completion", "zsh").stdout.startswith("#compdef tuimon")
    tcsh = run("tuimon-agent", "--print-completion", "tcsh")
    assert tcsh.returncode == 0 and "complete tuimon-agent" in tcsh.stdout


def test_an_unknown_shell_is_a_usage_error() -> None:
    out = run("tuimon", "--print-completion", "fish")
    assert out.returncode == 2 and "invalid choice: 'fish'" in out.stderr


def _options(parser: argparse.ArgumentParser) -> dict[str, list[str]]:
    """Every documented option of the command and of each subcommand."""
    found = {"": [o for a in parser._actions if a.help != argparse.SUPPRESS
                  for o in a.option_strings]}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found[name] = [o for a in sub._actions if a.help != argparse.SUPPRESS
                               for o in a.option_strings]
    return found


@needs_groff
@pytest.mark.parametrize("prog", ["tuimon", "tuimon-agent"])
def test_the_manual_renders_cleanly_and_documents_every_option(prog: str) -> None:
    roff = run(prog, "--print-man")
    assert roff.returncode == 0, roff.stderr
    assert roff.stdout.startswith(f'.TH "{prog.upper().replace("-", chr(92) + "-")}" "1"')
    # -ww: every warning; -z: no output, so stderr holds only the warnings.
    check = subprocess.run(["groff", "-man", "-Tutf8", "-ww", "-z"], input=roff.stdout,
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0 and check.stderr == ""
    page = subprocess.run(["groff", "-man", "-Tutf8", "-P", "-cbou", "-rLL=200n"],
                          input=roff.stdout, capture_output=True, text=True,
                          timeout=60).stdout
    parser = viewer_parser() if prog == "tuimon" else agent_parser()
    for command, options in _options(parser).items():
        if command:
            assert f"\n   {command}\n" in page, command
        for option in options:
            assert option in page, (command, option)
    for section in ("NAME", "SYNOPSIS", "OPTIONS", "COMMANDS", "EXIT STATUS", "FILES",
                    "ENVIRONMENT", "EXAMPLES"):
        assert f"\n{section}\n" in page, section


def test_help_ends_with_the_exit_codes_and_files() -> None:
    out = run("tuimon", "--help").stdout
    assert "exit status:" in out and "3    unknown (status, --once)" in out
    assert "$XDG_CONFIG_HOME/tuimon/config.toml" in out
    agent = run("tuimon-agent", "--help").stdout
    assert "exit status:" in agent and "tuimon-steps.sock" in agent


@pytest.mark.parametrize("prog", ["tuimon", "tuimon-agent"])
def test_every_option_says_what_it_does(prog: str) -> None:
    """`tuimon-agent sim --help` listed `--nodes NODES` and nothing more: each option of
    each command has a line of help (the manual and the completions are made from it)."""
    parser = viewer_parser() if prog == "tuimon" else agent_parser()
    parsers = {"": parser} | {
        name: sub for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for name, sub in action.choices.items()}
    silent = [(name, a.option_strings[0]) for name, p in parsers.items() for a in p._actions
              if a.option_strings and a.help is None]
    assert silent == [], silent
