"""Worker side: flags and bootstep, run observation, orphaned-queue janitor."""
