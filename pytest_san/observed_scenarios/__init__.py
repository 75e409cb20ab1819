"""Scenarios that judge a switch running in another process, by observation (``pytest_san.observed``): rsockets.

Run them with ``pytest --pyargs pytest_san.observed_scenarios --san-backend=hil --san-inventory=lab.yaml``; they
need the capability ``rsockets`` (a verbs host whose librdmacm exports the rsocket calls) and are skipped elsewhere.
"""
