"""What the node agent and the viewer share: the wire protocol and its field table, the
cleaning of outside strings, Slurm host lists, default ports and the node timings.

Both `agent` and `tuimon` import this package; it imports neither (tests/test_boundaries.py),
so an agent-only install needs nothing of the viewer.
"""
