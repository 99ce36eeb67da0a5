"""``python -m celery_aitp``: the same as the ``celery-aitp`` command."""

from celery_aitp.cli.standalone import main

if __name__ == "__main__":
    main()
