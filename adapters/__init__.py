"""Broker- and platform-specific adapters, installed as ``celery_aitp_adapters``.

Each module implements one port from :mod:`celery_aitp.ports`, imports its driver
lazily and raises only :class:`celery_aitp.errors.AdapterError`.
"""
