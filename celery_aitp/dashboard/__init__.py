"""Web dashboard, JSON API, Prometheus metrics and health endpoints (``dashboard`` extra).

It reads the shared store and the broker (through the QueueOps port) and decides nothing;
its one write is the stage document, through the same store call as the command line.
"""
