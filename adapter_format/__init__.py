"""Adapter archives: the declared base models, the smoke adapter maker, and the verifier."""
