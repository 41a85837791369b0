"""Range checks: settings that are not operator knobs (:func:`check_positive`), a knob's declared range
(:func:`check_value`, which :class:`engram_jax.ops.registry.Knob` and the public operators use), and the arrays a
public operator is given (:func:`check_embeddings`, :func:`check_scores`).

The checks on an operator's inputs run only on concrete values: under ``jit``, ``grad`` or ``vmap`` a value is a
``jax.core.Tracer`` (:func:`is_traced`) and is not looked at, so a traced program is the same with or without them
(a hyperparameter given as a Python number is still checked once, when the program is traced). Called eagerly, a
NaN query or an empty corpus is a one-line ``ValueError`` instead of a silent ranking or an error deep in JAX.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from engram_jax.core.errors import EngramError

# A range check's name -> (how an error says it, the test on a finite number).
CHECKS = {
  '>0': ('> 0', lambda v: v > 0),
  '>=0': ('>= 0', lambda v: v >= 0),
  '[0,1]': ('in [0, 1]', lambda v: 0 <= v <= 1),
  'int>=1': ('an integer >= 1', lambda v: v >= 1 and float(v).is_integer()),
  'int>=0': ('an integer >= 0', lambda v: v >= 0 and float(v).is_integer()),
}


def check_positive(options: Mapping[str, Any], *, where: str) -> None:
  """Every value of ``options`` must be a finite number > 0 (temperatures, learning rates, ...); a one-line
  ValueError naming ``where.<name>`` otherwise."""
  for name, value in options.items():
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
      raise EngramError(f'{where}.{name} must be a number > 0, got {value!r}')


def is_traced(x: Any) -> bool:
  """True when ``x`` is a tracer (inside ``jit``, ``grad``, ``vmap``, ...): its values are not known, so the boundary
  checks leave it alone (and cost the traced program nothing)."""
  return isinstance(x, jax.core.Tracer)


def is_number(value: Any) -> bool:
  """True for a real number given as a Python or NumPy scalar (not a bool, not an array)."""
  return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def check_value(value: Any, name: str, *, where: str, check: str | None, doc: str = '') -> None:
  """``value`` is a finite number within the declared range ``check`` (a key of :data:`CHECKS`, or None: finite
  only); a one-line :class:`EngramError` naming ``where``, ``name`` and the range otherwise.

  A concrete array (a knob given per question, or as a ``jnp`` scalar) is checked element by element and the
  first offending element reported; a traced value is not checked. ``None`` and non-numbers are the caller's to
  handle (a knob's declaration says whether None is allowed).

  Example:
    >>> from engram_jax.core.validation import check_value
    >>> check_value(0.5, 'lam', where='cfsr_scores', check='>0')
    >>> try:
    ...   check_value(float('nan'), 'lam', where='cfsr_scores', check='>0', doc='ridge strength')
    ... except ValueError as e:
    ...   print(e)
    cfsr_scores: lam must be a finite number (ridge strength), got nan
  """
  if is_traced(value):
    return
  what = f' ({doc})' if doc else ''
  if isinstance(value, (list, tuple)) and all(is_number(v) or isinstance(v, bool) for v in value):
    value = np.asarray(value)
  if isinstance(value, (np.ndarray, jax.Array)) and value.dtype != bool and np.issubdtype(value.dtype, np.number):
    a = np.asarray(value).reshape(-1)
    if a.size == 1:
      value = a[0].item()
    else:
      test = CHECKS[check][1] if check else lambda v: True
      bad = [i for i, v in enumerate(a.tolist()) if not (math.isfinite(v) and test(v))]
      if bad:
        check_value(a[bad[0]].item(), f'{name}[{bad[0]}]', where=where, check=check, doc=doc)
      return
  if isinstance(value, np.generic) and is_number(value):
    value = value.item()
  if not is_number(value):
    raise EngramError(f'{where}: {name} must be a number{what}, got {value!r}')
  if not math.isfinite(value):  # inf / nan rank silently
    raise EngramError(f'{where}: {name} must be a finite number{what}, got {value!r}')
  if check is None:
    return
  if check not in CHECKS:
    raise ValueError(f'knob {name}: unknown check {check!r}')
  said, test = CHECKS[check]
  if not test(value):
    raise EngramError(f'{where}: {name} must be {said}{what}, got {value!r}')


def _count_bad(x: Any, *, neg_inf: bool) -> int:
  """How many entries of the concrete float array ``x`` are NaN or inf (``-inf`` allowed when ``neg_inf``)."""
  if isinstance(x, jax.Array):  # on its device; a constant of a traced program is counted now, not traced
    with jax.ensure_compile_time_eval():
      bad = jnp.isnan(x) | (x == jnp.inf) if neg_inf else ~jnp.isfinite(x)
      return int(jnp.sum(bad))
  a = np.asarray(x)
  return int(np.sum(np.isnan(a) | (a == np.inf) if neg_inf else ~np.isfinite(a)))


def _is_float_array(x: Any) -> bool:
  return hasattr(x, 'dtype') and hasattr(x, 'shape') and np.issubdtype(x.dtype, np.floating)


def check_embeddings(where: str, query: Any, docs: Any, *, names: tuple[str, str] = ('query', 'docs')) -> None:
  """A public operator's ``query [..., D]`` and ``docs [..., N, D]`` (``names``: what its arguments are called):
  the same D, at least one item, every entry finite (NaN or inf is a one-line ValueError with the count); shapes
  are checked always, values only on concrete arrays.

  Example:
    >>> import jax.numpy as jnp
    >>> from engram_jax.core.validation import check_embeddings
    >>> try:
    ...   check_embeddings('cosine_scores', jnp.ones(4), jnp.zeros((0, 4)))
    ... except ValueError as e:
    ...   print(e)
    cosine_scores: docs has no items (shape (0, 4)): nothing to rank
  """
  q_name, docs_name = names
  q_shape, d_shape = jnp.shape(query), jnp.shape(docs)
  if len(d_shape) < 2:
    raise EngramError(f'{where}: {docs_name} must be [..., N, D], got shape {d_shape}')
  if not q_shape or q_shape[-1] != d_shape[-1]:
    raise EngramError(f'{where}: Shape mismatch: {q_name} {q_shape} and {docs_name} {d_shape} must share the last axis')
  if d_shape[-2] == 0:
    raise EngramError(f'{where}: {docs_name} has no items (shape {d_shape}): nothing to rank')
  for name, x in ((q_name, query), (docs_name, docs)):
    if is_traced(x) or not _is_float_array(x):
      continue
    n = _count_bad(x, neg_inf=False)
    if n:
      raise EngramError(
        f'{where}: {name} has {n} NaN or infinite value(s) of {int(np.prod(jnp.shape(x)))} (shape {jnp.shape(x)}): '
        'every score would be NaN or -inf and the ranking arbitrary; check the embeddings'
      )


def check_scores(where: str, **scores: Any) -> None:
  """Score arrays given to a public operator (``[..., N]``, e.g. legs' scores for a fusion): at least one item and
  no NaN or ``+inf`` (``-inf`` = not ranked is allowed); only concrete arrays are looked at."""
  for name, x in scores.items():
    if x is None:
      continue
    shape = jnp.shape(x)
    if not shape or shape[-1] == 0:
      raise EngramError(f'{where}: {name} has no items (shape {shape}): nothing to rank')
    if is_traced(x) or not _is_float_array(x):
      continue
    n = _count_bad(x, neg_inf=True)
    if n:
      raise EngramError(
        f'{where}: {name} has {n} NaN or +inf value(s) of {int(np.prod(shape))} (shape {shape}); scores must be '
        'finite, or -inf for an item not ranked'
      )
