"""The command lines' parser: a usage error is one line that says what is wrong, the
closest option when an option is misspelt, and where the help is; never the whole usage
block in front of the one line that matters."""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Sequence
from typing import Any, NoReturn


class Parser(argparse.ArgumentParser):
    """argparse, with one-line usage errors and suggestions for misspelt options.
    `usage_exit`: the exit code of a usage error (3 for a monitoring check, whose 2 says
    critical)."""

    def __init__(self, *args: Any, usage_exit: int = 2, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.usage_exit = usage_exit

    def error(self, message: str) -> NoReturn:
        self.exit(self.usage_exit, f"{self.prog}: {message}\ntry '{self.prog} --help'\n")

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        ns, extras = self.parse_known_args(args, namespace)
        if extras:
            parser = self._command_parser(ns) or self
            close = [match for word in extras if word.startswith("-")
                     for match in difflib.get_close_matches(
                         word.split("=", 1)[0], parser._option_string_actions, n=1,
                         cutoff=0.7)]
            hint = f" (did you mean {' '.join(dict.fromkeys(close))}?)" if close else ""
            parser.error(f"unrecognized arguments: {' '.join(extras)}{hint}")
        return ns

    def _command_parser(self, ns: argparse.Namespace) -> argparse.ArgumentParser | None:
        """The subcommand's parser the arguments chose, where there is one."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                chosen = getattr(ns, action.dest or "", None)
                parser: Any = action.choices.get(chosen) if chosen else None
                if isinstance(parser, argparse.ArgumentParser):
                    return parser
        return None

