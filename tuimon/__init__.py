"""tuimon: the terminal app. `tuimon.model` and `tuimon.sources` never import textual."""

from agent.version import __version__

__all__ = ["__version__"]
