"""Helpers only tests use, kept out of the production modules they serve (tests/test_no_test_code_in_prod.py)."""
