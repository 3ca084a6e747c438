"""Isolation: cgroup device limits, MPS lifecycle, MIG layout."""
