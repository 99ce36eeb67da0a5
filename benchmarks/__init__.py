"""Benchmarks: scripts that print figures and ratios (never run as tests)."""
