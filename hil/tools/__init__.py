"""Command-line tools: san-hil (prepare, nightly, bandwidth, the lab)."""
