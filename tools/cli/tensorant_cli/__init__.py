"""The `tensorant` command line (tensorant_cli.main:main)."""
