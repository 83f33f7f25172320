"""Tensorant control-plane core: importable without any cloud SDK."""
