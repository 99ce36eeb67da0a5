"""Scheduling rules shared by producers and workers: fair share, weighted tier order."""
