"""tuimon: the terminal app. `tuimon.model` and `tuimon.sources` never import textual."""

from tuimon_core.version import __version__

__all__ = ["__version__"]
