"""Pipelines: legs (operator + depth + weight) and a fusion, run on padded episode arrays.

A leg is a function ``leg(ep: EpisodeArrays, key) -> [Q, N]`` scores (``-inf`` = not ranked).
A :class:`Pipeline` with one leg and ``fusion='none'`` ranks by that leg; with ``fusion='rrf'`` it
fuses the legs by :func:`engram_jax.fusion.rrf_fuse`. The final list is the top ``k`` under the
shared tie rule (:mod:`engram_jax.ranking`), and every real question gets exactly ``k`` real items
(asserted by :func:`check_equal_k`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax import Array

from engram_jax import fusion, lexical, ranking, similarity
from engram_jax.types import Episode


@struct.dataclass
class EpisodeArrays:
  """One episode, padded. Shapes: N items, Q questions, D dims, V vocabulary (all bucketed)."""

  docs: Array         # [N, D] unit-norm item embeddings
  where: Array        # [N] True for real items
  positions: Array    # [N] int32 write order (index)
  doc_tf: Array       # [N, V] term counts
  queries: Array      # [Q, D] unit-norm question embeddings
  query_tf: Array     # [Q, V]
  query_where: Array  # [Q] True for real questions
  labels: Array       # [Q, N] True for gold items


def bucket(n: int, multiple: int) -> int:
  """Round ``n`` up to a multiple of ``multiple`` (at least one multiple), so jit compiles a few shapes."""
  return max(multiple, -(-n // multiple) * multiple)


def episode_arrays(episode: Episode, doc_emb: np.ndarray, query_emb: np.ndarray, *, n_multiple: int = 128,
                   q_multiple: int = 64, v_multiple: int = 1024) -> EpisodeArrays:
  """Pad one episode to bucketed shapes.

  Args:
    episode: the episode.
    doc_emb: ``[N_real, D]`` item embeddings (unit-norm).
    query_emb: ``[Q_real, D]`` question embeddings.

  Raises:
    ValueError: on NaN/inf embeddings or shape mismatches, naming the episode.
  """
  n, q = episode.n_items, len(episode.questions)
  if doc_emb.shape[0] != n or query_emb.shape[0] != q or doc_emb.shape[1:] != query_emb.shape[1:]:
    raise ValueError(f'Shape mismatch in episode {episode.id}: {n} items / {q} questions vs embeddings '
                     f'{doc_emb.shape} / {query_emb.shape}')
  for name, e in (('item', doc_emb), ('question', query_emb)):
    bad = ~np.all(np.isfinite(e), axis=-1)
    if bad.any():
      raise ValueError(f'Episode {episode.id}: {int(bad.sum())} {name} embeddings contain NaN/inf '
                       f'(first at row {int(np.argmax(bad))})')
  nb, qb = bucket(n, n_multiple), bucket(q, q_multiple)
  doc_toks = [lexical.tokenize(it.text) for it in episode.items]
  vocab = lexical.build_vocab(doc_toks)
  vb = bucket(len(vocab), v_multiple)
  docs = np.zeros((nb, doc_emb.shape[1]), np.float32)
  docs[:n] = doc_emb
  queries = np.zeros((qb, doc_emb.shape[1]), np.float32)
  queries[:q] = query_emb
  index = episode.index_of()
  labels = np.zeros((qb, nb), bool)
  for i, question in enumerate(episode.questions):
    labels[i, [index[g] for g in question.gold]] = True
  return EpisodeArrays(
      docs=docs, where=np.arange(nb) < n, positions=np.arange(nb, dtype=np.int32),
      doc_tf=lexical.term_counts(doc_toks, vocab, n_rows=nb, n_cols=vb),
      queries=queries,
      query_tf=lexical.term_counts([lexical.tokenize(x.text) for x in episode.questions], vocab, n_rows=qb,
                                   n_cols=vb),
      query_where=np.arange(qb) < q, labels=labels)


# ---- legs -------------------------------------------------------------------------------------------

def cosine_leg(ep: EpisodeArrays, key: Array) -> Array:
  """Dense cosine scores ``[Q, N]``."""
  del key
  return similarity.cosine_scores(ep.queries, ep.docs, where=ep.where)


def bm25_leg(ep: EpisodeArrays, key: Array, *, k1: float = 1.5, b: float = 0.75, epsilon: float = 0.25) -> Array:
  """BM25Okapi scores ``[Q, N]``."""
  del key
  return lexical.bm25_scores(ep.query_tf, ep.doc_tf, where=ep.where, k1=k1, b=b, epsilon=epsilon)


Leg = Callable[[EpisodeArrays, Array], Array]


@dataclasses.dataclass(frozen=True, eq=False)
class LegSpec:
  """A leg: its score function, depth (static) and fusion weight."""

  score: Leg
  depth: int = 10
  weight: float = 1.0
  name: str = ''


@dataclasses.dataclass(frozen=True, eq=False)
class Pipeline:
  """Legs and a fusion (``'none'`` for one leg, ``'rrf'``). Hashes by identity, so it can be jit-static."""

  legs: tuple[LegSpec, ...]
  fusion: str = 'none'
  k0: float = 60.0
  name: str = ''

  def __post_init__(self) -> None:
    if not self.legs:
      raise ValueError(f'Pipeline {self.name!r} has no legs')
    if self.fusion not in ('none', 'rrf'):
      raise ValueError(f'Pipeline {self.name!r}: unknown fusion {self.fusion!r} (expected none or rrf)')
    if self.fusion == 'none' and len(self.legs) != 1:
      raise ValueError(f'Pipeline {self.name!r}: fusion none needs exactly one leg, got {len(self.legs)}')


def make_pipeline(*, legs: Sequence[dict | LegSpec], fusion: str = 'none', k0: float = 60.0,
                  name: str = '') -> Pipeline:
  """Build a :class:`Pipeline` from plain dicts ``{score, depth, weight, name}`` (e.g. from config)."""
  specs = tuple(l if isinstance(l, LegSpec) else LegSpec(**l) for l in legs)
  return Pipeline(legs=specs, fusion=fusion, k0=float(k0), name=name)


def pipeline_scores(pipeline: Pipeline, ep: EpisodeArrays, key: Array) -> Array:
  """Final scores ``[Q, N]`` of a pipeline on one padded episode (before the top-k cut)."""
  keys = jax.random.split(key, len(pipeline.legs))
  leg_scores = [spec.score(ep, k_) for spec, k_ in zip(pipeline.legs, keys)]
  if pipeline.fusion == 'none':
    return jnp.where(ep.where, leg_scores[0], -jnp.inf)
  return fusion.rrf_fuse(jnp.stack(leg_scores), weights=jnp.asarray([s.weight for s in pipeline.legs]),
                         depths=[s.depth for s in pipeline.legs], where=ep.where, k0=pipeline.k0)


def pipeline_topk(pipeline: Pipeline, ep: EpisodeArrays, key: Array, *, k: int) -> Array:
  """Top-``k`` item indices ``[Q, k]`` under the shared tie rule. Jit with ``pipeline`` and ``k`` static."""
  idx, vals = ranking.top_k(pipeline_scores(pipeline, ep, key), k=k, where=ep.where)
  return jnp.where(jnp.isneginf(vals), -1, idx)


def check_equal_k(topk: np.ndarray, n_questions: int, *, k: int, name: str, episode: str) -> None:
  """Assert every real question got exactly ``k`` real, distinct items."""
  t = np.asarray(topk)[:n_questions]
  if t.shape[1] != k or np.any(t < 0):
    raise AssertionError(f'Pipeline {name} returned fewer than k={k} items in episode {episode}')
  if any(len(set(row)) != k for row in t.tolist()):
    raise AssertionError(f'Pipeline {name} returned duplicate items in episode {episode}')
