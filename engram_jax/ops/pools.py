"""Per-question cosine pools for the soft twins: what no fitted knob moves, computed once before training.

The CFS-R family and the greedy pickers all work on the cosine top-``P`` of each question (shared tie rule, no
knob moves it), so their soft twins precompute, per question, the pool's item indices, validity, cosines and Gram
block (and write-time fractions for the time-aware variants), padded to one item count ``n_pad`` across episodes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from engram_jax.core import ranking
from engram_jax.core.batch import EpisodeArrays
from engram_jax.ops.cosine import cosine_scores


def pad_items(x: np.ndarray, n_pad: int, fill) -> np.ndarray:
  """Pad the last (item) axis of ``x`` to ``n_pad`` with ``fill``."""
  widths = [(0, 0)] * (x.ndim - 1) + [(0, n_pad - x.shape[-1])]
  return np.pad(x, widths, constant_values=fill)


_COSINE = jax.jit(lambda q, d, w: cosine_scores(q, d, where=w))


def question_cosines(ep: EpisodeArrays, n_questions: int, n_pad: int) -> np.ndarray:
  """Cosine of each real question to every item ``[Q, n_pad]`` (the cosine leg's scores), ``-inf`` for masked or
  padded items."""
  s = np.asarray(_COSINE(ep.queries, ep.docs, ep.where))[:n_questions]
  return pad_items(s, n_pad, -np.inf)


def write_time(positions: jax.Array, where: jax.Array) -> jax.Array:
  r"""Write-order fraction ``[..., N]``: :math:`t_i = p_i / \max(N_{real} - 1, 1)` (0 oldest, 1 newest), 0 for padded
  items, ``N_real`` counted per list (the last axis; leading axes are batch, e.g. a soft twin's ``[B, N]`` rows).
  The time of the time-aware operators (:mod:`engram_jax.ops.tcfsr`) and of their soft twins' rows."""
  where = jnp.asarray(where, bool)
  n_real = jnp.sum(where, axis=-1, keepdims=True)
  t = jnp.asarray(positions).astype(jnp.result_type(float)) / jnp.maximum(n_real - 1, 1)
  return jnp.where(where, t, 0.0)


def cosine_pool_rows(
  ep: EpisodeArrays, n_questions: int, n_pad: int, pool: int, *, cos: np.ndarray | None = None, times: bool = False
) -> dict[str, np.ndarray]:
  """The cosine top-``pool`` of every real question of one episode.

  Returns ``{'pool_idx': [Q, P] int32, 'pool_valid': [Q, P] bool, 'pool_cos': [Q, P], 'pool_gram': [Q, P, P]}``
  (plus ``'pool_t': [Q, P]`` write-time fractions when ``times``), ``P = min(pool, n_pad)``; the episode Gram is
  computed once and gathered into blocks. ``cos`` may pass precomputed :func:`question_cosines`.
  """
  cos = question_cosines(ep, n_questions, n_pad) if cos is None else cos
  where = pad_items(np.broadcast_to(np.asarray(ep.where), (n_questions, ep.where.shape[0])), n_pad, False)
  p = min(int(pool), n_pad)
  idx, _ = ranking.top_k(jnp.asarray(cos), k=p, where=jnp.asarray(where))
  idx = np.asarray(idx)
  docs = np.asarray(ep.docs)
  docs = np.pad(docs, [(0, n_pad - docs.shape[0]), (0, 0)])
  gram = docs @ docs.T
  out = {
    'pool_idx': idx.astype(np.int32),
    'pool_valid': np.take_along_axis(where, idx, axis=-1),
    'pool_cos': np.take_along_axis(cos, idx, axis=-1),
    'pool_gram': gram[idx[:, :, None], idx[:, None, :]].astype(np.float32),
  }
  if times:
    t = pad_items(np.asarray(write_time(ep.positions, ep.where)), n_pad, 0.0)
    out['pool_t'] = t[idx]
  return out


def greedy_pool_rows(ep: EpisodeArrays, n_questions: int, n_pad: int, options, settings) -> dict[str, np.ndarray]:
  """A relaxed greedy picker's rows (its SoftTwin ``rows``): the cosine pool of the fit's ``greedy_pool``."""
  del options
  return cosine_pool_rows(ep, n_questions, n_pad, settings.greedy_pool)


def scatter_rows(values, idx, n: int, fill: float):
  """``values [B, P]`` at item indices ``idx [B, P]`` into ``[B, n]`` filled with ``fill``."""
  rows = jnp.arange(values.shape[0])[:, None]
  return jnp.full((values.shape[0], n), fill, values.dtype).at[rows, idx].set(values, unique_indices=True)
