"""The `tensorant` command line (shared.cli.main:main)."""
