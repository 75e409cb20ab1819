"""The wire between controller, agent and the agent's child processes (standard library, pushed to hosts)."""
