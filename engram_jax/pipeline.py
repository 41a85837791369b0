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

from engram_jax import controls, diversity, fusion, lexical, ranking, recency, reconstruction, similarity, validation
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
  query_len: Array    # [Q] number of query tokens (in or out of the vocabulary)
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
  q_toks = [lexical.tokenize(x.text) for x in episode.questions]
  query_len = np.zeros(qb, np.int32)
  query_len[:q] = [len(t) for t in q_toks]
  labels = np.zeros((qb, nb), bool)
  for i, question in enumerate(episode.questions):
    labels[i, [index[g] for g in question.gold]] = True
  return EpisodeArrays(
      docs=docs, where=np.arange(nb) < n, positions=np.arange(nb, dtype=np.int32),
      doc_tf=lexical.term_counts(doc_toks, vocab, n_rows=nb, n_cols=vb),
      queries=queries,
      query_tf=lexical.term_counts(q_toks, vocab, n_rows=qb, n_cols=vb),
      query_where=np.arange(qb) < q, query_len=query_len, labels=labels)


# ---- legs -------------------------------------------------------------------------------------------

def cosine_leg(ep: EpisodeArrays, key: Array) -> Array:
  """Dense cosine scores ``[Q, N]``."""
  del key
  return similarity.cosine_scores(ep.queries, ep.docs, where=ep.where)


def bm25_leg(ep: EpisodeArrays, key: Array, *, k1: float = 1.5, b: float = 0.75, epsilon: float = 0.25) -> Array:
  """BM25Okapi scores ``[Q, N]``."""
  del key
  return lexical.bm25_scores(ep.query_tf, ep.doc_tf, where=ep.where, k1=k1, b=b, epsilon=epsilon)


def _cos(ep: EpisodeArrays) -> Array:
  return similarity.cosine_scores(ep.queries, ep.docs, where=ep.where)


def _gram(ep: EpisodeArrays) -> Array:
  """The episode Gram ``[N, N]``, computed once per leg call and gathered into pool blocks by the ops."""
  return ep.docs @ ep.docs.T


def mmr_leg(ep: EpisodeArrays, key: Array, *, k: int = 10, lam: float = 0.5, pool: int | None = None) -> Array:
  """MMR picks as leg scores ``[Q, N]`` (picked items ranked in pick order, others ``-inf``)."""
  del key
  sel = diversity.mmr_select(ep.queries, ep.docs, k=k, lam=lam, where=ep.where, pool=pool, gram=_gram(ep))
  return diversity.selection_scores(sel, n=ep.docs.shape[0])


def cfs_leg(ep: EpisodeArrays, key: Array, *, k: int = 10, beta: float = 0.20, sigma: float = 0.40,
            floor: float = 1e-6, pool: int | None = None) -> Array:
  """CFS picks as leg scores ``[Q, N]``."""
  del key
  sel = diversity.cfs_select(ep.queries, ep.docs, k=k, beta=beta, sigma=sigma, where=ep.where, floor=floor,
                             pool=pool, gram=_gram(ep))
  return diversity.selection_scores(sel, n=ep.docs.shape[0])


def cfsr_leg(ep: EpisodeArrays, key: Array, *, pool: int = 150, iterations: int = 80, lam: float = 0.005,
             w: float = 0.90, batch_size: int | None = 16) -> Array:
  """CFS-R scores ``[Q, N]`` (``-inf`` outside the cosine pool); queries solved in chunks of ``batch_size``
  (about 3x faster than one vmap over all queries on CPU; ``None`` = all at once, likely better on GPU)."""
  del key
  return reconstruction.cfsr_scores(ep.queries, ep.docs, where=ep.where, gram=_gram(ep), pool=pool,
                                    iterations=iterations, lam=lam, w=w, batch_size=batch_size)


def tide_leg(ep: EpisodeArrays, key: Array, *, weight: float = 0.15, depth: int = 10, base: str = 'cosine',
             k1: float = 1.5, b: float = 0.75, epsilon: float = 0.25) -> Array:
  """Tide: the base leg's (``cosine`` or ``bm25``) top-``depth`` re-scored with a recency bonus."""
  if base == 'cosine':
    s = _cos(ep)
  elif base == 'bm25':
    s = bm25_leg(ep, key, k1=k1, b=b, epsilon=epsilon)
  else:
    raise ValueError(f'tide_leg: unknown base {base!r} (cosine or bm25)')
  return recency.tide_scores(s, ep.positions, weight=weight, depth=depth, where=ep.where)


def cos2_leg(ep: EpisodeArrays, key: Array, *, eps: float = 0.30, seed: int = 0) -> Array:
  """Perturbed cosine ("cos2"): cosine plus ``eps`` Gaussian noise; ``seed`` selects the noise draw."""
  return controls.perturbed_cosine(ep.queries, ep.docs, key=jax.random.fold_in(key, seed), eps=eps,
                                   where=ep.where)


def mem0_leg(ep: EpisodeArrays, key: Array, *, threshold: float = 0.1, pool: int = 60) -> Array:
  """mem0-style additive fusion of cosine and sigmoid-normalised BM25 (one score, use with fusion none).

  mem0 may return fewer than k candidates (semantic gate, pool); for equal k the remaining real items
  follow every candidate in cosine order (a backfill that mem0 itself does not do).
  """
  cos = _cos(ep)
  fused = controls.additive_fuse(cos, bm25_leg(ep, key), jnp.maximum(ep.query_len, 1), where=ep.where,
                                 threshold=threshold, pool=pool)
  backfill = -10.0 + cos  # below any fused score (>= -1 for candidates, since cosine >= -1)
  return jnp.where(jnp.isneginf(fused) & ep.where, backfill, fused)


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
    if not self.k0 > 0:
      raise ValueError(f'pipeline {self.name}: k0 must be > 0 (RRF rank offset), got {self.k0!r}')
    for i, spec in enumerate(self.legs):
      validation.check_leg(spec.score, depth=spec.depth, weight=spec.weight,
                           where=f'pipeline {self.name}, leg {spec.name or i}')


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
