"""Command line: ``celery -A proj aitp ...`` and the app-less ``celery-aitp``."""
