"""``san-hil nightly`` and ``san-hil matrix``: a night of the suite and the reference model on every host (pair) of an
inventory, and the kernel x provider table of a night's labs.

The parts: :mod:`hil.nightly.plan` (the host sets), :mod:`hil.nightly.runs` (running their pytest),
:mod:`hil.nightly.model` (the model's budget, arguments and results), :mod:`hil.nightly.results` (junit.xml,
report.json entries, summary.md), :mod:`hil.nightly.index` (index.html), :mod:`hil.nightly.job` (the job that ties
them together, with the bandwidth measurement), :mod:`hil.nightly.kernel_matrix` (matrix.md and matrix.json).
Their command lines are :mod:`hil.cli.nightly` and :mod:`hil.cli.matrix`.
"""
