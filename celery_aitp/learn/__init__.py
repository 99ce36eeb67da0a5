"""Learning from observed runs: training and model storage (never on the publish path)."""
