"""The project's one exception type for a user's mistake (a bad option, a bad input file, a refused run).

``EngramError`` subclasses ``ValueError``, so code and tests that catch ``ValueError`` keep working. The entry
points (:func:`experiments.lib.common.plain_errors`) print it as one line and exit 1; set ``ENGRAM_FULL_ERROR=1``
for the traceback (as Hydra's ``HYDRA_FULL_ERROR``).
"""

from __future__ import annotations


class EngramError(ValueError):
  """A user's mistake or a refused run, with a one-line message that says what to change."""


class DataNotFoundError(EngramError, FileNotFoundError):
  """A dataset file that is not where it is looked for (also a ``FileNotFoundError``)."""
