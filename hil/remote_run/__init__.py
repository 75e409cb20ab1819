"""``san-hil run --on HOST``: the pytest command run on a lab host, next to the NIC (docs/remote-run.md).

The user's side builds a wheelhouse for the host's Python (:mod:`~hil.remote_run.wheelhouse`), the host makes or
reuses a virtual environment from it (:mod:`~hil.remote_run.venv`), the inventory is rewritten to the lab as the
host sees it (:mod:`~hil.remote_run.lab_view`), the pytest arguments are read for the files to push and the reports
to bring back (:mod:`~hil.remote_run.arguments`, :mod:`~hil.remote_run.reports`), and
:mod:`~hil.remote_run.runner` runs it all, the output live. What runs on the host is in ``host/`` (Python 3.9+,
standard library only).
"""
