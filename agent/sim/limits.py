"""What one process can simulate: `SimCluster` refuses more, and the command lines' option
types use the same bounds, so a value argparse accepts is one the simulator takes."""

from tuimon_core.protocol.fields import MAX_GPUS  # what a node's frame may hold

MAX_NODES = 10_000
MAX_SPEED = 3600.0

__all__ = ["MAX_GPUS", "MAX_NODES", "MAX_SPEED"]
