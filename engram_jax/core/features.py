"""Question features read from the question's text: a few fixed cue indicators that a learned gate can use.

Deterministic and dataset-agnostic: lower-cased whole-word (or whole-phrase) matches against fixed cue lists,
decided before any fit and never tuned on scored questions. Columns (:data:`FEATURES`):

* ``current``: the question asks for a present or latest state (``currently``, ``now``, ``still``, ``latest``,
  ``most recent``, ``these days``, ``anymore``, ``at the moment``, ``right now``, ``recently``, ``new``,
  ``updated``, ``changed``, ``switched``, ``moved``);
* ``when``: it asks about time or order (``when``, ``what time``, ``date``, ``before``, ``after``, ``first``,
  ``last``, ``ago``, ``earlier``, ``later``, ``since``, ``until``, ``how long``, ``which came``, ``order``);
* ``count``: it aggregates (``how many``, ``how much``, ``total``, ``in total``, ``all the``, ``times``);
* ``bias``: 1 for every real question (so a gate's intercept can live in its weights).

``question_features(texts) -> [Q, F]`` float32; :class:`engram_jax.core.batch.EpisodeArrays` carries them as
``query_features`` (zero rows for padding).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

CUES: dict[str, tuple[str, ...]] = {
  'current': (
    'currently',
    'current',
    'now',
    'still',
    'latest',
    'most recent',
    'most recently',
    'these days',
    'anymore',
    'at the moment',
    'right now',
    'recently',
    'new',
    'updated',
    'changed',
    'switched',
    'moved',
    'nowadays',
  ),
  'when': (
    'when',
    'what time',
    'date',
    'before',
    'after',
    'first',
    'last',
    'ago',
    'earlier',
    'later',
    'since',
    'until',
    'how long',
    'which came',
    'order',
    'year',
    'month',
    'week',
    'day',
  ),
  'count': ('how many', 'how much', 'total', 'in total', 'all the', 'times'),
}
FEATURES: tuple[str, ...] = (*CUES, 'bias')


def _pattern(phrases: Sequence[str]) -> re.Pattern:
  alts = sorted((re.escape(p).replace(r'\ ', r'\s+') for p in phrases), key=len, reverse=True)
  return re.compile(r'\b(?:' + '|'.join(alts) + r')\b')


_PATTERNS = {name: _pattern(phrases) for name, phrases in CUES.items()}


def question_features(texts: Sequence[str]) -> np.ndarray:
  """``[Q, F]`` float32 cue indicators of each question text (columns :data:`FEATURES`)."""
  out = np.zeros((len(texts), len(FEATURES)), np.float32)
  for i, text in enumerate(texts):
    low = text.lower()
    for j, name in enumerate(CUES):
      out[i, j] = float(bool(_PATTERNS[name].search(low)))
    out[i, -1] = 1.0
  return out
