"""Range checks for operator knobs and fitting settings, run before any work.

Each check raises ``ValueError`` with one line that names the option, the value and the allowed range, e.g.
``pipeline rrf_cos_bm25_cfs, leg cfs: sigma must be > 0 (a Gaussian width), got -0.1``.

Rules are keyed by knob name within a leg function (by its ``__name__``), with a fallback by knob name alone for
knobs whose meaning is the same everywhere (``pool``, ``iterations``, ``depth``). A knob without a rule is not
checked (the operator's own shape checks still apply).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any

Rule = tuple[Callable[[float], bool], str]

_POSITIVE: Rule = (lambda v: v > 0, '> 0')
_NON_NEGATIVE: Rule = (lambda v: v >= 0, '>= 0')
_UNIT: Rule = (lambda v: 0 <= v <= 1, 'in [0, 1]')
_AT_LEAST_ONE: Rule = (lambda v: v >= 1 and float(v).is_integer(), 'an integer >= 1')

# Knobs whose meaning does not depend on the operator.
GENERIC_RULES: dict[str, Rule] = {
    'pool': _AT_LEAST_ONE, 'iterations': _AT_LEAST_ONE, 'depth': _AT_LEAST_ONE, 'k': _AT_LEAST_ONE,
    'k1': (_POSITIVE[0], '> 0 (BM25 term saturation)'), 'b': (_UNIT[0], 'in [0, 1] (BM25 length normalisation)'),
    'epsilon': (_NON_NEGATIVE[0], '>= 0 (BM25 idf floor factor)'),
    'sigma': (_POSITIVE[0], '> 0 (a Gaussian width)'), 'beta': (_POSITIVE[0], '> 0 (a field strength)'),
    'w': (_UNIT[0], 'in [0, 1] (blend weight)'), 'eps': _NON_NEGATIVE, 'threshold': _UNIT,
    'gamma': _NON_NEGATIVE, 'alpha': _NON_NEGATIVE, 'anchor': _NON_NEGATIVE, 'theta': _UNIT, 'delta': _NON_NEGATIVE,
    'rho0': _UNIT, 'floor': _POSITIVE,
}
# Knobs whose meaning depends on the operator (leg function name -> knob -> rule).
LEG_RULES: dict[str, dict[str, Rule]] = {
    'mmr_leg': {'lam': (_UNIT[0], 'in [0, 1] (MMR relevance/diversity trade-off)')},
    'cfsr_leg': {'lam': (_POSITIVE[0], '> 0 (ridge strength)')},
    'tcfsr_prior_leg': {'lam': (_POSITIVE[0], '> 0 (ridge strength)')},
    'tcfsr_basis_leg': {'lam': (_POSITIVE[0], '> 0 (ridge strength)')},
    'tcfsr_gated_leg': {'lam': (_POSITIVE[0], '> 0 (ridge strength)')},
}


def _check(where: str, name: str, value: Any, rule: Rule) -> None:
  ok_fn, allowed = rule
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    return  # strings (base, tokenizer) and None (batch_size) are the operator's to check
  if math.isnan(value) or not ok_fn(value):
    raise ValueError(f'{where}: {name} must be {allowed}, got {value!r}')


def leg_options(score: Callable[..., Any]) -> dict[str, Any]:
  """The keyword options a leg will run with: the function's keyword-only defaults updated by a partial's
  keywords."""
  fn = getattr(score, 'func', score)
  try:
    params = inspect.signature(fn).parameters
  except (TypeError, ValueError):
    return dict(getattr(score, 'keywords', {}) or {})
  options = {n: p.default for n, p in params.items() if p.kind == p.KEYWORD_ONLY and p.default is not p.empty}
  options.update(getattr(score, 'keywords', {}) or {})
  return options


def check_leg(score: Callable[..., Any], *, depth: int, weight: float, where: str) -> None:
  """Check a leg's depth, fusion weight and every knob that has a rule.

  Raises:
    ValueError: one line naming ``where`` (pipeline and leg), the knob, the allowed range and the value.
  """
  _check(where, 'depth', depth, _AT_LEAST_ONE)
  _check(where, 'weight', weight, (_NON_NEGATIVE[0], '>= 0 (fusion weight)'))
  fn_name = getattr(getattr(score, 'func', score), '__name__', '')
  rules = LEG_RULES.get(fn_name, {})
  for name, value in leg_options(score).items():
    rule = rules.get(name, GENERIC_RULES.get(name))
    if rule is not None:
      _check(where, name, value, rule)


def check_positive(options: Mapping[str, Any], *, where: str) -> None:
  """Every value of ``options`` must be a finite number > 0 (temperatures, learning rates, ...)."""
  for name, value in options.items():
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
      raise ValueError(f'{where}.{name} must be a number > 0, got {value!r}')
