"""Planted bugs: each module a provider or proxy with one realistic bug (``BREAKS``: the rules it breaks)."""
