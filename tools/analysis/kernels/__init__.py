"""mmevo's Triton kernels analysed without a GPU: their DRAM traffic
(:mod:`.traffic`) and their ahead-of-time compiles to cubin with the
binaries' resources (:mod:`.aot`, one compile in :mod:`.cubin`).

Tooling, not part of the ``mmevo`` package: import it from the
repository root (``python -m pytest`` and ``python -m`` put it on
``sys.path``), e.g. ``from tools.analysis.kernels import aot``.
"""
