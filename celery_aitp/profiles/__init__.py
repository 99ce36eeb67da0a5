"""Resource profiles per task: decaying histograms of what observed runs used."""
