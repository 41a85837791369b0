"""Research scripts: each answers one question, on a finished run or with its own Hydra jobs (the main tools are
``experiments.evaluate``, ``fit``, ``compare``, ``collect`` and ``bench``). See docs/research.md.

* ``python -m experiments.research.plateau``: a multirun's results as a plateau table and plot; per-category
  paired tests of one run;
* ``python -m experiments.research.boundary_table``: the evidence boundary of a run (parent recall, exact recall,
  bounded parent expansion);
* ``python -m experiments.research.cfsr_diagnosis``: per question, why standalone CFS-R trails cosine (pool,
  solver against an exact NNLS, ranking);
* ``python -m experiments.research.search_compare``: the gradient fit against a Hydra grid and optuna on the same
  knobs and split;
* ``python -m experiments.research.search_budget``: gradient fit vs optuna TPE vs a grid at an equal wall budget,
  in one process;
* ``python -m experiments.research.cfsr_grad_bench``: CFS-R gradients unrolled vs forward vs implicit (agreement,
  time, compiled memory).
"""
