"""What one process can simulate: `SimCluster` refuses more, and the command lines' option
types use the same bounds, so a value argparse accepts is one the simulator takes."""

MAX_NODES = 10_000
MAX_GPUS = 64
MAX_SPEED = 3600.0
