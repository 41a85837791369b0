"""Speed, one module per tool, one command line (``python -m experiments.bench``, :mod:`experiments.bench.cli`):

* :mod:`~experiments.bench.operators`: every registered operator's hard leg in JAX vs its NumPy reference (and BM25
  vs rank_bm25 / bm25s), interleaved rounds (default; ``--data locomo`` for the real episodes);
* :mod:`~experiments.bench.harness`: the whole evaluation run, timed by phase (``--harness``);
* :mod:`~experiments.bench.scale`: cost and memory versus episode size N = 1e3..1e5 (``--scale``);
* :mod:`~experiments.bench.floor`: the CFS-R leg against its arithmetic floor on LoCoMo (``--cfsr-floor``);
* :mod:`~experiments.bench.common`: the machine description, timing primitives, LoCoMo episodes.

Synthetic episodes come from the library (:mod:`engram_jax.testing.synthetic`).
"""
