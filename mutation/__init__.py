"""Mutation testing of pytest-san's reference implementations with mutmut (docs/mutation.md)."""
