"""Tide: a base leg's top candidates re-scored with a linear write-order (recency) bonus.

Hard: :func:`tide_scores`. Soft twin: the hard operator is already smooth in its one fitted knob (the recency
weight enters linearly; the base's top-``pool`` cut does not move with it), so the twin is :func:`tide_scores` on
the precomputed base scores. Knobs: ``recency`` (the weight :math:`w`, fitted), ``pool`` (base candidates
re-scored, static), ``base`` (``cosine`` or ``bm25``) and BM25's ``k1``/``b``/``epsilon``/``tokenizer``/``form`` for a
BM25 base.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

from engram_jax.core import ranking, validation
from engram_jax.core.batch import EpisodeArrays
from engram_jax.ops import bm25 as bm25_ops
from engram_jax.ops import pools
from engram_jax.ops.cosine import cosine_scores
from engram_jax.ops.registry import Knob, Operator, SoftTwin, check_knobs, knob_defaults, register

BASES = ('cosine', 'bm25')

# The declaration of Tide's knobs: the one place their defaults are written (the leg's signature reads _D; a BM25
# base's k1 / b / epsilon default to BM25's own declaration).
_BM25 = knob_defaults(bm25_ops.KNOBS)
KNOBS = (
  Knob('recency', 0.15, transform='identity', doc='recency weight w'),
  Knob('pool', 10, static=True, check='int>=1', doc='base candidates re-scored'),
  Knob('base', 'cosine', static=True, check=BASES, doc='base leg'),
  Knob('k1', _BM25['k1'], static=True, check='>0', doc='BM25 term saturation of a BM25 base'),
  Knob('b', _BM25['b'], static=True, check='[0,1]', doc='BM25 length normalisation of a BM25 base'),
  Knob('epsilon', _BM25['epsilon'], static=True, check='>=0', doc='BM25 idf floor factor of a BM25 base'),
  Knob('tokenizer', _BM25['tokenizer'], static=True, check=tuple(bm25_ops.ANALYZERS), doc='analyzer of a BM25 base'),
  Knob('form', _BM25['form'], static=True, check=bm25_ops.FORMS, doc='BM25 form of a BM25 base'),
)
_D = knob_defaults(KNOBS)


def _scatter_flags(idx: Array, flags: Array, n: int) -> Array:
  """``[..., N]`` False, with ``flags [..., d]`` set at the distinct indices ``idx [..., d]`` of each list."""
  batch, d = idx.shape[:-1], idx.shape[-1]
  flat_i, flat_f = idx.reshape(-1, d), flags.reshape(-1, d)
  rows = jnp.arange(flat_i.shape[0])[:, None]
  out = jnp.zeros((flat_i.shape[0], n), bool).at[rows, flat_i].set(flat_f, unique_indices=True)
  return out.reshape(batch + (n,))


def tide_scores(base: Array, positions: Array, *, weight: ArrayLike, depth: int, where: Array | None = None) -> Array:
  r"""Tide: the base leg's top-``depth`` candidates plus a linear recency bonus.

  Definition:
    .. math::
      s_i = b_i + w \, \frac{p_i}{N_{real} - 1} \quad (i \in \text{top-}depth(b)),
      \qquad s_i = -\infty \text{ otherwise}

  where :math:`b` is the base leg's scores (cosine or BM25), :math:`p_i` the item's position in write
  order (0 = oldest) and :math:`N_{real}` the number of real items, so the bonus runs from 0 (oldest)
  to :math:`w` (newest). With :math:`N_{real} = 1` the single item (position 0) gets bonus 0
  (the denominator is taken as 1); with :math:`N_{real} = 0` everything is ``-inf``.

  Equal k: only the base's top-``depth`` candidates (shared tie rule: the later item wins ties at
  the cut) are re-scored, so Tide never returns an item the base would not have returned at that
  depth. Ties in the Tide score are left to the shared rule of whoever ranks them (the more recently
  written item first). Base scores of ``-inf`` (items the base does not rank) stay ``-inf``.

  Args:
    base: ``[..., N]`` base leg scores; leading axes are batch.
    positions: ``[N]`` or ``[..., N]`` write-order positions, ``0..N_real-1`` for real items.
    weight: recency weight :math:`w`; traced (fit on a training split).
    depth: static number of base candidates re-scored (``depth >= N`` means all).
    where: ``[N]`` or ``[..., N]`` True for real items.

  Returns:
    ``[..., N]`` scores; ``-inf`` outside the base's top-``depth`` and for masked items.

  Example:
    >>> import jax.numpy as jnp
    >>> from engram_jax import tide_scores
    >>> base = jnp.array([0.9, 0.5, 0.8, 0.1])  # e.g. cosine; item 3 is the newest
    >>> [round(s, 3) for s in tide_scores(base, jnp.arange(4), weight=0.3, depth=3).tolist()]  # item 3 is outside the top-3
    [0.9, 0.6, 1.0, -inf]
  """
  validation.check_scores('tide_scores', base=base)
  check_knobs('tide', 'tide_scores', names={'weight': 'recency', 'depth': 'pool'}, weight=weight, depth=depth)
  base = jnp.asarray(base)
  n = base.shape[-1]
  real = jnp.ones((n,), bool) if where is None else jnp.asarray(where, bool)
  real = jnp.broadcast_to(real, base.shape)
  d = min(depth, n)
  idx, vals = ranking.top_k(base, k=d, where=real)
  cand = _scatter_flags(idx, jnp.isfinite(vals), n)  # [..., N]: nothing [..., d, N]
  n_real = jnp.sum(real, axis=-1, keepdims=True)
  denom = jnp.maximum(n_real - 1, 1).astype(base.dtype)
  pos = jnp.asarray(positions, base.dtype)
  s = base + jnp.asarray(weight, base.dtype) * pos / denom
  return jnp.where(cand, s, -jnp.inf)


def base_scores(
  ep: EpisodeArrays,
  key: Array,
  *,
  base: str,
  k1: float,
  b: float,
  epsilon: float,
  tokenizer: str = _D['tokenizer'],
  form: str = _D['form'],
) -> Array:
  """The base leg's scores ``[Q, N]``: cosine, or BM25 with ``k1``/``b``/``epsilon`` of the ``form`` over the
  analyzer ``tokenizer``."""
  if base == 'cosine':
    return cosine_scores(ep.queries, ep.docs, where=ep.where)
  if base == 'bm25':
    return bm25_ops.bm25_leg(ep, key, k1=k1, b=b, epsilon=epsilon, tokenizer=tokenizer, form=form)
  raise ValueError(f'tide: unknown base {base!r}; allowed: {list(BASES)}')


def tide_leg(
  ep: EpisodeArrays,
  key: Array,
  *,
  recency: float = _D['recency'],
  pool: int = _D['pool'],
  base: str = _D['base'],
  k1: float = _D['k1'],
  b: float = _D['b'],
  epsilon: float = _D['epsilon'],
  tokenizer: str = _D['tokenizer'],
  form: str = _D['form'],
) -> Array:
  """Tide ``[Q, N]``: the base leg's (``cosine`` or ``bm25``) top-``pool`` re-scored with ``+ recency * position
  / (N - 1)``."""
  s = base_scores(ep, key, base=base, k1=k1, b=b, epsilon=epsilon, tokenizer=tokenizer, form=form)
  return tide_scores(s, ep.positions, weight=recency, depth=pool, where=ep.where)


_BASE_SCORES = jax.jit(base_scores, static_argnames=('base', 'tokenizer', 'form'))  # one compilation per base and shape


def _rows(ep: EpisodeArrays, n_questions: int, n_pad: int, options: Mapping[str, Any], settings) -> dict:
  del settings
  s = _BASE_SCORES(
    ep,
    jax.random.key(0),
    base=options['base'],
    k1=options['k1'],
    b=options['b'],
    epsilon=options['epsilon'],
    tokenizer=options['tokenizer'],
    form=options['form'],
  )
  return {'base': pools.pad_items(np.asarray(s)[:n_questions], n_pad, -np.inf)}


def _soft(rows: Mapping[str, Array], values: Mapping[str, Array], ctx) -> Array:
  return tide_scores(rows['base'], ctx.positions, weight=values['recency'], depth=int(values['pool']), where=ctx.where)


TIDE = register(
  Operator(
    name='tide',
    leg=tide_leg,
    doc='base top-pool + recency * write-order fraction (Tide)',
    knobs=KNOBS,
    soft=SoftTwin(rows=_rows, scores=_soft, fill={'base': -np.inf}),
    needs=lambda options: {'tokenizers': (options['tokenizer'],)} if options['base'] == 'bm25' else {},
  )
)
