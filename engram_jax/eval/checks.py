"""Checks of what a run is given, on plain values and loaded episodes (no configuration tree): metric names
against k and a dataset's own metrics, questions to score, distinct corpora, the folds of a fit, integer settings.
Each raises one line (:class:`~engram_jax.core.errors.EngramError`) naming what it was given. The entry points
(``experiments/``) call them after reading their Hydra config; library callers can call them on their own data.

Example:
  >>> from engram_jax.eval.checks import check_int
  >>> check_int(10, 'eval.k', minimum=1)
  10
  >>> check_int(10.5, 'eval.k', minimum=1)
  Traceback (most recent call last):
  ...
  engram_jax.core.errors.EngramError: eval.k must be an integer >= 1, got 10.5
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Sequence
from typing import Any

from engram_jax.core.errors import EngramError
from engram_jax.metrics import labels as metrics_lib

log = logging.getLogger(__name__)

# fewer training questions than this in a fold of a fit: warned (a fit on a handful of questions is noise)
MIN_TRAIN_QUESTIONS = 20
# metrics a dataset may own (computed from an episode's own fields, not from labels)
KNOWN_EPISODE_METRICS = ('answer', 'newest_first', 'parent_recall')


def check_metrics(names: list[str], *, k: int, supported: list[str], where: str) -> None:
  """Every metric parses, its cutoff is <= k, and a dataset-owned metric is one the dataset declares."""
  if not names:
    raise EngramError(f'{where}: no metrics given; expected names such as ndcg@10')
  for m in names:
    try:
      base, cut = metrics_lib.parse_metric(m, tuple(supported) + KNOWN_EPISODE_METRICS)
    except ValueError:
      allowed = sorted(metrics_lib.METRICS) + sorted(supported)
      raise EngramError(f'{where}: unknown metric {m!r}; allowed: {allowed} followed by @k') from None
    if base not in metrics_lib.METRICS and base not in supported:
      raise EngramError(
        f'{where}: metric {m!r} cannot be computed on this dataset; its dataset-owned metrics are '
        f'{sorted(supported)} (label metrics {sorted(metrics_lib.METRICS)} always can)'
      )
    if not 1 <= cut <= k:
      raise EngramError(f'{where}: metric {m!r} needs cutoff {cut}, but eval.k={k}; allowed cutoffs 1..{k}')


def check_scored_questions(episodes, where: str) -> int:
  """The number of questions to score in ``episodes``; a one-line error when there are none (a scored set of 0
  questions would give empty means and zero paired differences)."""
  n = sum(len(e.questions) for e in episodes)
  if n == 0:
    raise EngramError(
      f'{where}: 0 questions to score after loading ({len(episodes)} episodes; see the load '
      'report for what was left out)'
    )
  return n


def check_distinct_corpora(episodes, where: str) -> None:
  """Refuse two episodes with identical content (:func:`engram_jax.data.splits.corpus_fingerprint`: the same
  item texts, e.g. a conversation copied under a new id), which would be scored twice; names both."""
  from engram_jax.data import splits

  seen: dict[str, str] = {}
  for e in episodes:
    fp = splits.corpus_fingerprint(e)
    if fp in seen:
      raise EngramError(
        f'{where}: episodes {seen[fp]!r} and {e.id!r} have identical content up to case and whitespace (the '
        'same corpus fingerprint: a copy under another id) and would be scored twice; remove one'
      )
    seen[fp] = e.id


def check_folds(episodes, folds: list[list[str]]) -> None:
  """Every fold of a fit scores at least one question and trains on at least one (before any fitting)."""
  n_q = {e.id: len(e.questions) for e in episodes}
  total = sum(n_q.values())
  few = sorted({total - sum(n_q.get(e, 0) for e in fold) for fold in folds})
  if few and few[0] < MIN_TRAIN_QUESTIONS:
    log.warning(
      'a fold of this fit trains on only %d question(s) (fewer than %d): its fitted knobs are noise, and a minibatch '
      'larger than that repeats them; use more training episodes',
      few[0],
      MIN_TRAIN_QUESTIONS,
    )
  for fold in folds:
    scored = sum(n_q.get(e, 0) for e in fold)
    if scored == 0:
      raise EngramError(
        f'fold {sorted(fold)}: its scored episodes have 0 questions, so it would score nothing '
        '(choose other episodes, fit.n_test or fit.seed)'
      )
    if total - scored == 0:
      raise EngramError(
        f'fold {sorted(fold)}: the episodes outside it have 0 questions, so there is nothing to '
        'fit on (fewer folds, or more episodes with questions)'
      )


def check_known_keys(keys: Sequence[str], allowed: Sequence[str], where: str) -> None:
  """Refuse a key outside ``allowed`` (a typo, an option nobody reads) in one line naming it with the closest known
  key; ``where``: the keys' prefix (``'fit.'``, ``'eval.'``, ``''`` for the top level).

  Example:
    >>> check_known_keys(['steps'], ['steps', 'seed'], 'fit.')
    >>> check_known_keys(['stps'], ['steps', 'seed'], 'fit.')
    Traceback (most recent call last):
    ...
    engram_jax.core.errors.EngramError: unknown option fit.stps (did you mean fit.steps?): no part of the program reads it; known fit keys: ['seed', 'steps']
  """
  extra = [k for k in keys if k not in allowed]
  if extra:
    hints = {k: difflib.get_close_matches(str(k), list(allowed), n=1) for k in extra}
    said = ', '.join(f'{where}{k}' + (f' (did you mean {where}{hints[k][0]}?)' if hints[k] else '') for k in extra)
    raise EngramError(
      f'unknown option {said}: no part of the program reads it; known {where.rstrip(".") or "top-level"} keys: '
      f'{sorted(allowed)}'
    )


def check_flag(value: Any, where: str, *, default: bool) -> bool:
  """``value`` when it is true or false, ``default`` when it is ``None``; a one-line error naming ``where`` otherwise
  (``'yes'`` would read as true).

  Example:
    >>> check_flag(None, 'fit.final', default=False)
    False
    >>> check_flag('yes', 'fit.final', default=False)
    Traceback (most recent call last):
    ...
    engram_jax.core.errors.EngramError: fit.final must be true or false, got 'yes'
  """
  value = default if value is None else value
  if not isinstance(value, bool):
    raise EngramError(f'{where} must be true or false, got {value!r}')
  return value


def check_int(value: Any, where: str, *, minimum: int, why: str = '') -> int:
  """``value`` when it is an integer >= ``minimum``; a one-line error naming ``where`` otherwise (``eval.k=10.5``
  would reach JAX as a shape, and ``int()`` would truncate it silently). ``why``: a reason, appended."""
  if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
    raise EngramError(f'{where} must be an integer >= {minimum}{why}, got {value!r}')
  return value
