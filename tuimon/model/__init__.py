"""Cluster state, efficiency, SLO and alert logic: plain Python, no textual."""
