"""``corral sim``: replay a GPU-cluster workload through corral's own core on a simulated clock.

``workload`` (the input values), ``readers`` (files -> values, with errors naming file, line and
column), ``engine`` (the discrete-event loop over ``corral.core``), ``policy`` (``corral`` and the
``fifo`` baseline), ``summary`` (the figures), ``report`` (report.html and its PNGs).
The simulator imports ``corral.domain`` and ``corral.core`` only (an import-linter contract).
"""
