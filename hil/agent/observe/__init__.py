"""Programs the agent runs under observation: each in a process of its own, its calls bounded (``driver``)."""
