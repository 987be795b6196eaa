"""The subcommands of `decodegate` (see harness.cli): argument parsing and what each one does
with the run, the record store and the verdict."""
