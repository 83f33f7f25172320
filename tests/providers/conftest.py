"""Shared by every provider's tests."""

import pytest

# The contract suite is a plain module its test classes inherit from: rewrite its asserts too.
pytest.register_assert_rewrite("tests.providers.contract")
