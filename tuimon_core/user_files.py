"""Files the commands write where the user said (`--truth`, `--targets-file`, `-o`): a
path that cannot be written is a usage error naming the option, not a traceback."""

from __future__ import annotations

from pathlib import Path

from tuimon_core.errors import UsageError


def write_file(path: str | Path, text: str, option: str) -> None:
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"{option} {path}: cannot write: {exc.strerror or exc}") from None
