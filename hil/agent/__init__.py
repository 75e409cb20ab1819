"""The agent that runs on a lab host: standard library (+ pyverbs for the verbs engine), Python 3.9+."""
