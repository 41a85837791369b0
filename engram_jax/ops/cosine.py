"""Cosine: dense similarity of unit-norm embeddings, the base of every dense operator.

No knobs, so nothing to fit: its soft twin is the hard leg itself (its scores are constant during a fit).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import Array

from engram_jax.core import validation
from engram_jax.core.batch import EpisodeArrays
from engram_jax.ops.registry import Operator, register


def cosine_scores(query: Array, docs: Array, *, where: Array | None = None) -> Array:
  r"""Cosine similarity of unit-norm embeddings.

  Definition:
    .. math:: s_i = \langle q, d_i \rangle  \quad (\|q\| = \|d_i\| = 1)

  Args:
    query: ``[..., D]`` unit-norm query embeddings; leading axes are batch.
    docs: ``[N, D]`` unit-norm item embeddings.
    where: ``[N]`` True for real items; masked items score ``-inf``.

  Returns:
    ``[..., N]`` scores.

  Example:
    >>> import jax.numpy as jnp
    >>> from engram_jax import cosine_scores
    >>> docs = jnp.eye(3)  # three unit-norm items
    >>> print(cosine_scores(jnp.array([0.6, 0.8, 0.0]), docs, where=jnp.array([True, True, False])))
    [ 0.6  0.8 -inf]
  """
  validation.check_embeddings('cosine_scores', query, docs)
  s = jnp.einsum('...d,nd->...n', query, docs)
  if where is not None:
    s = jnp.where(where, s, -jnp.inf)
  return s


def cosine_leg(ep: EpisodeArrays, key: Array) -> Array:
  """Dense cosine scores ``[Q, N]``."""
  del key
  return cosine_scores(ep.queries, ep.docs, where=ep.where)


COSINE = register(Operator(name='cosine', leg=cosine_leg, knobs=(), doc='dense cosine similarity'))
