"""Helpers shared by the entry points; nothing here is run with ``python -m``.

* :mod:`experiments.lib.common`: config -> plain library values (operator modules, pipelines, datasets, the
  embedder) and a run's files;
* :mod:`experiments.lib.checks`: the config checked before any data is loaded (one-line errors naming the option);
* :mod:`experiments.lib.protocol`: protocols fixed in advance (committed file, SHA-256, the ledger of scorings);
* :mod:`experiments.lib.fit_setup`: the fit a config declares (components from the registry, ``fit.variants``);
  :mod:`experiments.lib.fit_conditioned`, :mod:`experiments.lib.fit_adapter`: the reports of the built-in components
  (``fit.reports``);
* :mod:`experiments.lib.answer`: Tier 1 in a run (the reader from config, answers and answer metrics per dataset);
* :mod:`experiments.lib.grid`: a grid of one pipeline's knob values in one call (``+grid=...`` in evaluate);
  :mod:`experiments.lib.grid_figure` draws its ``grid.png`` (NumPy and matplotlib only: in a helper process).
"""
