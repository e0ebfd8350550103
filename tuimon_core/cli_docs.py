"""Shell completion and manual pages for both commands, generated from their parsers.

Both are written from the argparse tree itself, so a new option is completed and
documented the moment it is added: completion scripts through shtab (bash, zsh, tcsh),
the manual page (roff, `man -l`) here. The sections a manual has beyond the options
(exit status, files, environment, examples) are the same text `--help` ends with.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn

from tuimon_core.version import __version__

SHELLS = ("bash", "zsh", "tcsh")


def add_doc_options(parser: argparse.ArgumentParser, sections: dict[str, str]) -> None:
    """`--print-completion SHELL` and `--print-man` on a top-level parser, and the extra
    manual sections as the epilog of its `--help`."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = "\n\n".join(f"{title.lower()}:\n{_indent(text)}"
                                for title, text in sections.items())
    parser.add_argument("--print-completion", choices=SHELLS, action=_CompletionAction,
                        help="print a completion script for this shell and exit "
                             "(e.g. `eval \"$(%(prog)s --print-completion bash)\"`)")
    parser.add_argument("--print-man", nargs=0, action=_ManAction,
                        help="print the manual page (roff) and exit "
                             "(`%(prog)s --print-man | man -l -`)")
    parser.set_defaults(_man_sections=sections)


def complete_from(action: argparse.Action, names: Callable[[], list[str]]) -> None:
    """The values an option completes to, asked for only when a completion script is
    printed (`--theme`: the themes there are then), never checked at parse time."""
    action.completion_names = names  # type: ignore[attr-defined]


def completion(parser: argparse.ArgumentParser, shell: str) -> str:
    import shtab  # only when asked: not on the path of every start

    for action in _actions(parser):
        names = getattr(action, "completion_names", None)
        if names is not None and action.choices is None:
            action.choices = names()  # this parser prints the script and is done
    return str(shtab.complete(parser, shell=shell))


def _actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    out = []
    for action in parser._actions:
        out.append(action)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out += _actions(sub)
    return out


def manpage(parser: argparse.ArgumentParser, sections: dict[str, str],
            date: datetime.date | None = None) -> str:
    """The manual page of a command and its subcommands, in roff (man(7) macros)."""
    prog = parser.prog
    day = (date or datetime.date.today()).isoformat()
    out = [f'.TH "{_upper(prog)}" "1" "{day}" "{prog} {__version__}" "User Commands"',
           ".SH NAME", f"{_roff(prog)} \\- {_roff(_first_sentence(parser.description))}",
           ".SH SYNOPSIS", _synopsis(parser)]
    if parser.description:
        out += [".SH DESCRIPTION", _roff(parser.description)]
    out += [".SH OPTIONS", *_options(parser)]
    subs = list(_subcommands(parser))
    if subs:
        out.append(".SH COMMANDS")
        for name, help_text, sub in subs:
            out += [f".SS {_roff(name)}", _synopsis(sub)]
            if help_text:
                out += [".PP", _roff(help_text)]
            out += _options(sub)
    for title, text in sections.items():
        out += [f".SH {_upper(title)}", *_paragraphs(text)]
    return "\n".join(out) + "\n"


# -- argparse actions --------------------------------------------------------------------

class _CompletionAction(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> NoReturn:
        sys.stdout.write(completion(parser, str(values)))
        parser.exit()


class _ManAction(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> NoReturn:
        sys.stdout.write(manpage(parser, parser.get_default("_man_sections") or {}))
        parser.exit()


# -- roff --------------------------------------------------------------------------------

def _roff(text: str | None) -> str:
    """Text safe in a roff line: backslashes doubled, hyphens as minus signs (so options
    can be searched and copied), no line starting with a control character."""
    text = " ".join((text or "").split())
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\\&" + text if text[:1] in (".", "'") else text


def _upper(text: str) -> str:
    return _roff(text.upper())


def _first_sentence(text: str | None) -> str:
    first = (text or "").split(". ")[0].strip()
    return first.rstrip(".")


def _indent(text: str) -> str:
    return "\n".join(f"  {line}" if line else "" for line in text.splitlines())


def _paragraphs(text: str) -> list[str]:
    """Blank-line separated paragraphs; lines starting with two spaces stay as they are
    (a command example or a table)."""
    out: list[str] = []
    for block in text.strip("\n").split("\n\n"):
        lines = block.splitlines()
        if all(line.startswith("  ") for line in lines):
            out += [".PP", ".nf", *(_roff_keep(line[2:]) for line in lines), ".fi"]
        else:
            out += [".PP", _roff(" ".join(lines))]
    return out


def _roff_keep(line: str) -> str:
    """One preformatted line: escaped, spacing kept."""
    line = line.replace("\\", "\\e").replace("-", "\\-")
    return "\\&" + line


def _synopsis(parser: argparse.ArgumentParser) -> str:
    usage = parser.format_usage().removeprefix("usage: ").strip()
    return ".nf\n" + "\n".join(_roff_keep(line.strip()) for line in usage.splitlines()) + "\n.fi"


def _options(parser: argparse.ArgumentParser) -> list[str]:
    out: list[str] = []
    for action in _documented(parser._actions):
        if action.option_strings:
            names = ", ".join(action.option_strings)
            if action.nargs != 0:
                names += " " + _metavar(action)
        else:
            names = _metavar(action) if action.metavar is not None else action.dest
        out += [".TP", f"\\fB{_roff(names)}\\fR"]
        out.append(_roff(_help(action, parser)) or "\\&")
    return out


def _documented(actions: Sequence[argparse.Action]) -> Iterator[argparse.Action]:
    for action in actions:
        if action.help == argparse.SUPPRESS or isinstance(action, argparse._SubParsersAction):
            continue
        yield action


def _metavar(action: argparse.Action) -> str:
    if action.metavar is not None:
        return str(action.metavar if isinstance(action.metavar, str)
                   else " ".join(action.metavar))
    if action.choices is not None:
        return "{" + ",".join(str(c) for c in action.choices) + "}"
    return action.dest.upper()


def _help(action: argparse.Action, parser: argparse.ArgumentParser) -> str:
    text = action.help or ""
    if "%(" in text:
        params = {**vars(action), "prog": parser.prog}
        params["choices"] = ", ".join(str(c) for c in action.choices or [])
        with contextlib.suppress(KeyError, TypeError, ValueError):  # argparse's own way
            text = text % params
    return text


def _subcommands(parser: argparse.ArgumentParser
                 ) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, helps.get(name, ""), sub
