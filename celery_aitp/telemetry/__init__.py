"""Counters and record buffers: cheap to write on the hot path, flushed in the background."""
