"""Theme files (TOML) to Textual themes: the packaged ones and the user's own.

A theme file holds Textual's theme fields and, under [variables], the heatmap scale
`heat-0` .. `heat-8` (one per level of tuimon_core.heat_levels), `heat-stale` and
`heat-nodata`. Users drop their own
files in $XDG_CONFIG_HOME/tuimon/themes/ (default ~/.config/tuimon/themes/).
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from pathlib import Path

from textual.color import Color
from textual.theme import Theme

from tuimon_core.heat_levels import LEVELS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

log = logging.getLogger(__name__)

THEME_FIELDS = ("primary", "secondary", "warning", "error", "success", "accent",
                "foreground", "background", "surface", "panel", "boost")
REQUIRED_VARIABLES = (*(f"heat-{i}" for i in range(LEVELS)), "heat-stale", "heat-nodata")
DEFAULT_THEME = "tuimon-dark"


class ThemeFileError(ValueError):
    """A theme file that cannot be used; the message names the file and the problem."""


def packaged_theme_dir() -> Path:
    here = Path(__file__).resolve().parent.parent
    for candidate in (here / "themes", here.parent / "themes"):  # wheel, then checkout
        if candidate.is_dir():
            return candidate
    return here / "themes"


def user_theme_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "tuimon" / "themes"


def load_theme_file(path: Path) -> Theme:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ThemeFileError(f"{path}: cannot read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ThemeFileError(f"{path}: not valid TOML: {exc}") from None
    except RecursionError:
        raise ThemeFileError(f"{path}: not a theme: nested deeper than Python reads") from None
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise ThemeFileError(f"{path}: needs a `name`")
    if not isinstance(data.get("primary"), str):
        raise ThemeFileError(f"{path}: needs a `primary` colour")
    variables = data.get("variables", {})
    if not isinstance(variables, dict):
        raise ThemeFileError(f"{path}: [variables] must be a table")
    missing = [v for v in REQUIRED_VARIABLES if v not in variables]
    if missing:
        raise ThemeFileError(f"{path}: [variables] lacks {', '.join(missing)}")
    kwargs = {k: data[k] for k in THEME_FIELDS if isinstance(data.get(k), str)}
    # Every colour is parsed now: a theme that cannot be drawn is refused here, with its
    # file and key, never when the app (or `t`) switches to it.
    for key, value in [*kwargs.items(), *((k, variables[k]) for k in REQUIRED_VARIABLES)]:
        try:
            Color.parse(str(value))
        except Exception:
            raise ThemeFileError(f"{path}: {key} = {str(value)[:40]!r} is not a colour") \
                from None
    theme = Theme(name=name, dark=bool(data.get("dark", True)),
                  variables={k: str(v) for k, v in variables.items()}, **kwargs)
    try:
        theme.to_color_system().generate()
    except Exception as exc:
        raise ThemeFileError(f"{path}: cannot be drawn: {exc}") from None
    return theme


@functools.cache
def heat_variable_defaults() -> dict[str, str]:
    """The heatmap variables of the packaged default theme: what a theme without them (one
    of Textual's own, picked from the command palette) falls back to, so the map's CSS
    always resolves."""
    try:
        variables = load_theme_file(packaged_theme_dir() / "dark.toml").variables
    except ThemeFileError as exc:
        log.warning("%s", exc)
        variables = {}
    grey = {v: "#808080" for v in REQUIRED_VARIABLES}
    return {**grey, **{k: v for k, v in variables.items() if k in REQUIRED_VARIABLES}}


def load_themes(extra_dirs: list[Path] | None = None) -> tuple[list[Theme], list[str]]:
    """Every packaged and user theme, and the problems met on the way (never fatal)."""
    themes: list[Theme] = []
    problems: list[str] = []
    dirs = [packaged_theme_dir(), user_theme_dir(), *(extra_dirs or [])]
    for folder in dirs:
        if not folder.is_dir():
            continue
        for path in sorted(folder.glob("*.toml")):
            try:
                themes.append(load_theme_file(path))
            except ThemeFileError as exc:
                problems.append(str(exc))
                log.warning("%s", exc)
    return themes, problems
