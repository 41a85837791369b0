"""Test fixture only: the BM25 x (1 + c t^p) operator of docs/extending.md with the twin bug of issue 17.

The hard leg is right. The soft twin computes the write fraction with ``write_time`` as it was before issue 17
(``N_real`` summed over *every* axis), applied to the fitter's batched ``[B, N]`` rows: ``N_real`` becomes the number
of real items of all B rows together, so ``t`` shrinks by about B and the twin fits a different function. Registered
as ``bm25_recent`` on import (an out-of-tree module would be named in ``ops_modules``); ``check_operator`` and
``experiments.fit``'s twin check must both reject it, naming the operator. The correct operator is in
docs/extending.md ("Building on an existing operator").
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import Array

from engram_jax.ops import bm25
from engram_jax.ops.pools import write_time
from engram_jax.ops.registry import Knob, Operator, SoftTwin, knob_defaults, register

KNOBS = bm25.KNOBS + (
  Knob('c', 0.5, transform='softplus', check='>=0', doc='recency boost'),
  Knob('p', 1.0, transform='log', check='>0', doc='recency exponent'),
)
_D = knob_defaults(KNOBS)


def old_write_time(positions: Array, where: Array) -> Array:
  """``pools.write_time`` before issue 17: documented ``[N]``, it sums ``where`` over every axis."""
  where = jnp.asarray(where, bool)
  n_real = jnp.sum(where)
  t = jnp.asarray(positions).astype(jnp.result_type(float)) / jnp.maximum(n_real - 1, 1)
  return jnp.where(where, t, 0.0)


def boost(t: Array, *, c, p) -> Array:
  pos = t > 0
  return 1.0 + c * jnp.where(pos, jnp.where(pos, t, 1.0) ** p, 0.0)


def bm25_recent_leg(
  ep,
  key: Array,
  *,
  k1: float = _D['k1'],
  b: float = _D['b'],
  epsilon: float = _D['epsilon'],
  tokenizer: str = _D['tokenizer'],
  form: str = _D['form'],
  delta: float = _D['delta'],
  c: float = _D['c'],
  p: float = _D['p'],
) -> Array:
  s = bm25.bm25_leg(ep, key, k1=k1, b=b, epsilon=epsilon, tokenizer=tokenizer, form=form, delta=delta)
  return s * boost(write_time(ep.positions, ep.where), c=c, p=p)  # [N]: right


def _soft(rows, values, ctx) -> Array:
  t = old_write_time(ctx.positions, ctx.where)  # [B, N] through an [N] helper: the bug
  s = bm25.term_scores(rows, values) * boost(t, c=values['c'], p=values['p'])
  return jnp.where(ctx.where, s, -jnp.inf)


OPERATOR = Operator(
  name='bm25_recent',
  leg=bm25_recent_leg,
  doc='BM25 x (1 + c t^p), buggy twin',
  knobs=KNOBS,
  soft=SoftTwin(rows=bm25.term_rows, scores=_soft, fill=bm25.TERM_FILL),
  needs=bm25.BM25.needs,
)
register(OPERATOR, replace=True)
