"""Tests of mutation/ (the mutmut runner): the message-only filter, the triage file, the selection."""
