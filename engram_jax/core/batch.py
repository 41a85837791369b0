"""Padded episode arrays: what every operator reads.

An :class:`EpisodeArrays` is one episode padded to bucketed shapes (items N, questions Q, vocabulary V), with masks
for the real entries: item and question embeddings, write positions, BM25 term counts and gold labels.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import numpy as np
from jax import Array

from engram_jax.core import features, pytree
from engram_jax.core.errors import EngramError
from engram_jax.core.lexicon import Lexicon, build_lexicon, get_tokenizer
from engram_jax.core.padding import bucket
from engram_jax.core.types import Episode

# An embedding row is unit-norm when | ||v|| - 1 | < NORM_TOL (the embedding cache's tolerance, engram_jax.data.embed):
# every dense operator scores by dot products, which are cosines only for unit vectors.
NORM_TOL = 1e-3


@pytree.dataclass
class EpisodeArrays:
  """One episode, padded. Shapes: N items, Q questions, D dims, V vocabulary (all bucketed).

  ``lexicons[name]`` holds the sparse term statistics (:class:`engram_jax.core.lexicon.Lexicon`: ``[N, L]`` item
  terms, ``[Q, T]`` question terms, ``[V]`` vocabulary mask) of every tokenizer asked for in :func:`episode_arrays`
  (:data:`engram_jax.core.lexicon.TOKENIZERS`): always ``'words'``, e.g. ``'flat'`` for LongMemEval's flat-bm25.
  ``query_len`` counts the ``'words'`` tokens of each question.

  Example:
    >>> import numpy as np
    >>> from engram_jax import Episode, Item, Question, episode_arrays
    >>> items = (Item('a', 'dog adopted', 'S1', 0), Item('b', 'invoice overdue', 'S1', 1))
    >>> ep = Episode('e', items, (Question('q', 'which dog?', ('a',), ('S1',), 1),))
    >>> arrays = episode_arrays(ep, np.eye(2, 4, dtype=np.float32), np.eye(1, 4, dtype=np.float32), n_multiple=8)
    >>> arrays.docs.shape, arrays.where.tolist(), arrays.labels.shape  # [N, D], [N], [Q, N]
    ((2, 4), [True, True], (1, 2))
  """

  docs: Array  # [N, D] unit-norm item embeddings
  where: Array  # [N] True for real items
  positions: Array  # [N] int32 write order (index)
  queries: Array  # [Q, D] unit-norm question embeddings
  query_where: Array  # [Q] True for real questions
  query_len: Array  # [Q] number of query tokens (in or out of the vocabulary)
  labels: Array  # [Q, N] True for gold items
  lexicons: dict[str, Lexicon] = dataclasses.field(default_factory=dict)  # tokenizer -> its term statistics
  query_features: Array | None = None  # [Q, F] question text features (engram_jax.core.features; 0 for padding)
  leg_inputs: dict[str, Array] = dataclasses.field(default_factory=dict)  # name -> [Q, N] per-question item values
  # a leg reads (-inf = none, and on padding), built on the host by episode_arrays(inputs=...): e.g. an external
  # TREC run's order (engram_jax.ops.trec_run)


def check_unit_norm(emb: np.ndarray, what: str) -> None:
  """Every row of ``emb [R, D]`` has norm 1 within :data:`NORM_TOL`; a one-line ValueError naming ``what``, how many
  rows are off and the worst norm otherwise (vectors of norm 1..40 scored as cosines turn recall@5 1.0 into 0.0).

  Example:
    >>> import numpy as np
    >>> from engram_jax.core.batch import check_unit_norm
    >>> check_unit_norm(np.eye(3, 4), 'items')
    >>> try:
    ...   check_unit_norm(np.eye(3, 4) * [[1], [2], [40]], 'items')
    ... except ValueError as e:
    ...   print(str(e)[:66])
    items: 2 of 3 rows are not unit-norm (worst: row 2, norm 40; toler
  """
  if not len(emb):
    return
  norms = np.linalg.norm(np.asarray(emb, np.float64), axis=-1)
  off = np.abs(norms - 1.0) >= NORM_TOL
  if off.any():
    worst = int(np.argmax(np.abs(norms - 1.0)))
    raise EngramError(
      f'{what}: {int(off.sum())} of {len(norms)} rows are not unit-norm (worst: row {worst}, norm '
      f'{norms[worst]:.4g}; tolerance {NORM_TOL}, norms {norms.min():.4g}..{norms.max():.4g}): the dense operators '
      'score by dot products, which are cosines only for unit vectors; normalise them (x / ||x||) or pass '
      'unit_norm=False'
    )


def episode_arrays(
  episode: Episode,
  doc_emb: np.ndarray,
  query_emb: np.ndarray,
  *,
  n_multiple: int = 128,
  q_multiple: int = 64,
  v_multiple: int = 1024,
  l_multiple: int = 16,
  t_multiple: int = 8,
  tokenizers: Sequence[str] = ('words',),
  unit_norm: bool = True,
  inputs: Mapping[str, Callable[[Episode], np.ndarray]] | None = None,
) -> EpisodeArrays:
  """Pad one episode to bucketed shapes.

  Args:
    episode: the episode.
    doc_emb: ``[N_real, D]`` item embeddings (unit-norm).
    query_emb: ``[Q_real, D]`` question embeddings.
    tokenizers: names in :data:`engram_jax.core.lexicon.TOKENIZERS` whose term statistics to build
      (``lexicons[name]``); ``'words'`` is always built.
    n_multiple, q_multiple, v_multiple, l_multiple, t_multiple: bucket multiples of N, Q, V, L (distinct terms
      per item) and T (distinct terms per question).
    unit_norm: True (the default): every embedding row must be unit-norm (within :data:`NORM_TOL`), as every
      embedder of :mod:`engram_jax.data.embed` returns them; False for embeddings meant unnormalised.
    inputs: ``{name: builder}``: ``builder(episode) -> [Q_real, N_real]`` per-question item values that a leg reads
      as ``leg_inputs[name]`` (padded with ``-inf``): what an operator's ``needs`` asks for under ``'inputs'``
      (:func:`engram_jax.eval.pipeline.build_options`), e.g. an external run's order (:mod:`engram_jax.ops.trec_run`).

  Raises:
    ValueError: on NaN/inf embeddings, rows not of unit norm (counted, with the worst; ``unit_norm``), shape
      mismatches (naming the episode) or an unknown tokenizer.

  Example:
    >>> import numpy as np
    >>> from engram_jax import Episode, Item, Question, episode_arrays
    >>> items = (Item('a', 'dog adopted', 'S1', 0), Item('b', 'invoice overdue', 'S1', 1))
    >>> ep = Episode('e', items, (Question('q', 'which dog?', ('a',), ('S1',), 1),))
    >>> arrays = episode_arrays(ep, np.eye(2, 4, dtype=np.float32), np.eye(1, 4, dtype=np.float32), n_multiple=8)
    >>> int(arrays.where.sum()), bool(arrays.labels[0, 0])
    (2, True)
  """
  tokenize_fns = {t: get_tokenizer(t) for t in dict.fromkeys(('words', *tokenizers))}
  n, q = episode.n_items, len(episode.questions)
  if doc_emb.shape[0] != n or query_emb.shape[0] != q or doc_emb.shape[1:] != query_emb.shape[1:]:
    raise ValueError(
      f'Shape mismatch in episode {episode.id}: {n} items / {q} questions vs embeddings '
      f'{doc_emb.shape} / {query_emb.shape}'
    )
  for name, e in (('item', doc_emb), ('question', query_emb)):
    bad = ~np.all(np.isfinite(e), axis=-1)
    if bad.any():
      raise ValueError(
        f'Episode {episode.id}: {int(bad.sum())} {name} embeddings contain NaN/inf (first at row {int(np.argmax(bad))})'
      )
    if unit_norm:
      check_unit_norm(e, f'Episode {episode.id}: {name} embeddings')
  nb, qb = bucket(n, n_multiple), bucket(q, q_multiple)
  docs = np.zeros((nb, doc_emb.shape[1]), np.float32)
  docs[:n] = doc_emb
  queries = np.zeros((qb, doc_emb.shape[1]), np.float32)
  queries[:q] = query_emb
  index = episode.index_of()
  labels = np.zeros((qb, nb), bool)
  for i, question in enumerate(episode.questions):
    labels[i, [index[g] for g in question.gold]] = True
  lexicons, query_len = {}, np.zeros(qb, np.int32)
  for name, fn in tokenize_fns.items():
    q_toks = [fn(x.text) for x in episode.questions]
    if name == 'words':
      query_len[:q] = [len(t) for t in q_toks]
    lexicons[name] = build_lexicon(
      [fn(it.text) for it in episode.items],
      q_toks,
      n_rows=nb,
      q_rows=qb,
      l_multiple=l_multiple,
      t_multiple=t_multiple,
      v_multiple=v_multiple,
    )
  query_features = np.zeros((qb, len(features.FEATURES)), np.float32)
  query_features[:q] = features.question_features([x.text for x in episode.questions])
  leg_inputs = {}
  for name, build in (inputs or {}).items():
    values = np.asarray(build(episode), np.float32)
    if values.shape != (q, n):
      raise ValueError(f'Episode {episode.id}: leg input {name!r} has shape {values.shape}, expected {(q, n)}')
    leg_inputs[name] = np.full((qb, nb), -np.inf, np.float32)
    leg_inputs[name][:q, :n] = values
  return EpisodeArrays(
    docs=docs,
    where=np.arange(nb) < n,
    positions=np.arange(nb, dtype=np.int32),
    queries=queries,
    query_where=np.arange(qb) < q,
    query_len=query_len,
    labels=labels,
    lexicons=lexicons,
    query_features=query_features,
    leg_inputs=leg_inputs,
  )


def _stack_padded(xs: Sequence[np.ndarray], fill=0) -> np.ndarray:
  """``[E, *max shape]``: each array copied into the top-left corner of its slot, the rest ``fill``."""
  xs = [np.asarray(x) for x in xs]
  shape = tuple(max(x.shape[i] for x in xs) for i in range(xs[0].ndim))
  out = np.full((len(xs), *shape), fill, xs[0].dtype)
  for i, x in enumerate(xs):
    out[(i, *(slice(0, s) for s in x.shape))] = x
  return out


def stack_arrays(arrays: Sequence[EpisodeArrays]) -> EpisodeArrays:
  """Episodes padded to common shapes (the largest N, Q, V of the list) and stacked on a leading episode axis
  ``[E, ...]``, so that a pipeline compiles once for them all and runs as one jitted map over episodes (the axis to
  shard across devices). Padded items and questions are masked as in :func:`episode_arrays`; ``positions`` keep
  counting past the real items, as there.
  """
  if not arrays:
    raise ValueError('stack_arrays: no episodes')
  names = list(arrays[0].lexicons)
  if any(list(a.lexicons) != names for a in arrays):
    raise ValueError('stack_arrays: episodes were built with different tokenizers')
  inputs = sorted(arrays[0].leg_inputs)
  if any(sorted(a.leg_inputs) != inputs for a in arrays):
    raise ValueError('stack_arrays: episodes were built with different leg inputs')
  n = max(a.docs.shape[0] for a in arrays)

  def stack(field: str, fill=0) -> np.ndarray:
    return _stack_padded([getattr(a, field) for a in arrays], fill)

  def stack_lexicon(t: str) -> Lexicon:
    lexs = [a.lexicons[t] for a in arrays]
    return Lexicon(
      **{
        f: _stack_padded([getattr(x, f) for x in lexs], False if f == 'vocab_where' else 0)
        for f in ('doc_terms', 'doc_counts', 'query_terms', 'query_counts', 'vocab_where')
      }
    )

  return EpisodeArrays(
    docs=stack('docs'),
    where=stack('where', False),
    positions=np.broadcast_to(np.arange(n, dtype=np.int32), (len(arrays), n)).copy(),
    queries=stack('queries'),
    query_where=stack('query_where', False),
    query_len=stack('query_len'),
    labels=stack('labels', False),
    lexicons={t: stack_lexicon(t) for t in names},
    query_features=None if arrays[0].query_features is None else stack('query_features'),
    leg_inputs={name: _stack_padded([a.leg_inputs[name] for a in arrays], -np.inf) for name in inputs},
  )


def _leaf_shapes(a: EpisodeArrays) -> list[tuple[int, ...]]:
  import jax  # local: keeps this module's import light for the loaders

  return [np.shape(x) for x in jax.tree_util.tree_leaves(a)]


def stack_groups(arrays: Sequence[EpisodeArrays], *, max_waste: float = 2.0) -> list[list[int]]:
  """Partition episodes into groups to stack (:func:`stack_arrays`): few groups, bounded padding.

  Greedy over episodes sorted by size (total elements of their arrays): an episode joins the current group while
  the group's padded size (its largest shapes x its count) stays within ``max_waste`` x the sum of its members'
  own sizes; otherwise it starts a new group. Episodes of similar size (LoCoMo's ten conversations) form one
  group; a dataset with a long tail of sizes (LongMemEval) gets a few, so that the compile count stays small and
  no episode is padded to the largest one. Returns the groups as sorted episode indices, smallest sizes first.
  """
  if max_waste < 1.0:
    raise ValueError(f'max_waste must be >= 1, got {max_waste}')
  shapes = [_leaf_shapes(a) for a in arrays]
  sizes = [sum(int(np.prod(s)) for s in sh) for sh in shapes]
  groups: list[list[int]] = []
  top: list[tuple[int, ...]] = []
  own = 0
  for e in sorted(range(len(arrays)), key=lambda i: sizes[i]):
    if groups:
      merged = [tuple(max(x, y) for x, y in zip(a, b)) for a, b in zip(top, shapes[e])]
      padded = (len(groups[-1]) + 1) * sum(int(np.prod(s)) for s in merged)
      if padded <= max_waste * (own + sizes[e]):
        groups[-1].append(e)
        top, own = merged, own + sizes[e]
        continue
    groups.append([e])
    top, own = shapes[e], sizes[e]
  return [sorted(g) for g in groups]
