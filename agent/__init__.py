"""The node side of tuimon: collectors, sampler, stream server, simulator.

Nothing in this package imports textual; the agent must stay small on a compute node.
"""

from tuimon_core.version import __version__

__all__ = ["__version__"]
