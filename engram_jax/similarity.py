"""Dense similarity."""

from __future__ import annotations

import jax.numpy as jnp
from jax import Array


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
  """
  s = jnp.einsum('...d,nd->...n', query, docs)
  if where is not None:
    s = jnp.where(where, s, -jnp.inf)
  return s
