"""Hard ranking primitives with the one tie rule every method shares.

Tie rule (the Tide page's): among equal scores, the more recently written item comes first, i.e. the
larger index along the list axis wins. Items are stored in write order, so index == position.
Masked items (``where`` False) always rank after every real item.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import Array


def _masked(scores: Array, where: Array | None) -> Array:
  scores = jnp.asarray(scores)
  if where is None:
    return scores
  return jnp.where(where, scores, -jnp.inf)


def top_k(scores: Array, *, k: int, where: Array | None = None) -> tuple[Array, Array]:
  """Top-``k`` indices with ties broken towards the later item.

  Args:
    scores: ``[..., N]`` scores, larger is better.
    k: number of indices (static).
    where: ``[..., N]`` True for real items.

  Returns:
    ``(indices [..., k] int32, values [..., k])``; masked picks (when fewer than ``k`` real items)
    come last and have value ``-inf``.

  Example:
    >>> import jax.numpy as jnp
    >>> from engram_jax import top_k
    >>> idx, vals = top_k(jnp.array([0.5, 0.9, 0.5, 0.1]), k=2)
    >>> print(idx)  # the tie at 0.5 goes to the later item (2)
    [1 2]
  """
  s = _masked(scores, where)
  n = s.shape[-1]
  # lax.top_k keeps the lower index first on ties: reverse so the later item has the lower index.
  vals, idx_rev = jax.lax.top_k(jnp.flip(s, axis=-1), k)
  return (n - 1 - idx_rev).astype(jnp.int32), vals


def ranks(scores: Array, *, where: Array | None = None) -> Array:
  """1-based ranks of every item under the shared tie rule; masked items get ranks after all real ones.

  Args:
    scores: ``[..., N]``.
    where: ``[..., N]``.

  Returns:
    ``[..., N]`` int32 ranks (1 = best). Not differentiable; see ``relax.soft_ranks``.

  Example:
    >>> import jax.numpy as jnp
    >>> from engram_jax import ranks
    >>> print(ranks(jnp.array([0.5, 0.9, 0.5, 0.1])))  # 1-based; ties: the later item first
    [3 1 2 4]
  """
  s = _masked(scores, where)
  n = s.shape[-1]
  order_rev = jnp.argsort(-jnp.flip(s, axis=-1), axis=-1, stable=True)
  order = n - 1 - order_rev  # order[..., r] = index of the item at rank r+1
  r = jnp.argsort(order, axis=-1)
  return (r + 1).astype(jnp.int32)
