"""A tiny FunctionApp that tests/test_devhost.py runs in the dev host."""
