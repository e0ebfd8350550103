"""Collectors: each reads one part of the machine and returns plain values."""
