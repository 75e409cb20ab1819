"""Legal variants: providers and proxies that differ from pytest-san's own only in ways the contract allows."""
