"""Measurements on lab hosts: RDMA write bandwidth against message size, through the harness and with
``ib_write_bw``, and their plot (:mod:`hil.measure.bandwidth`; ``san-hil nightly`` and ``benchmarks/lab.py``)."""
