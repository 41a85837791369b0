"""Speed: every registered operator's hard leg in JAX (jitted, after warm-up) vs its NumPy reference, timed
interleaved in rounds, plus RRF fusion and BM25 against its peer libraries (rank_bm25, bm25s).

    python -m experiments.bench                       # 10 synthetic LoCoMo-sized episodes, every operator
    python -m experiments.bench --episodes 2 --repeats 2 --rounds 3 --ops cosine,cfsr,rrf
    python -m experiments.bench --ops bm25        # BM25 vs rank_bm25 and bm25s (pip install "engram_jax[bench]")
    python -m experiments.bench --data locomo         # the real LoCoMo episodes (MiniLM, cached)
    python -m experiments.bench --ref-queries 0       # time the references on every query (slow)
    python -m experiments.bench --set tide.pool=10    # change one operator's knob
    python -m experiments.bench --ops-modules mypkg.myop --ops myop   # an out-of-tree operator
    python -m experiments.bench --scale --out outputs/scale.md       # cost vs episode size N, 1e3 .. 1e5
    python -m experiments.bench --scale --scale-n 1000,3000,10000 --rounds 3 --scale-ops cosine,cfsr

The operators come from the registry (:data:`engram_jax.ops.OPERATORS`): every registered operator is timed
with its declaration's knob defaults, except where :data:`OVERRIDES` pins the locked setups of the published
pages (greedy pool 50, Tide pool 50 / recency 0.1). A benchmark episode is a :class:`BenchEpisode`
``(episode, docs [N, D], queries [Q, D])``, padded by :func:`engram_jax.batch.episode_arrays` exactly as
``experiments.evaluate`` pads it, so any loader's episodes can be benched.

Rounds: every episode is padded, compiled and warmed up first; then, in each of ``--rounds`` rounds (5), every
episode and operator is timed on the JAX side and the reference side back to back (JAX first in even rounds, the
reference first in odd ones), so that a change in machine load falls on both sides. A round's sample is the time
summed over episodes; the table gives, per side and for the ratio (per round ``reference / JAX``), the median and
(min-max) over rounds, with the XLA / BLAS thread settings under it.

What is timed, per episode and round:

* JAX: the operator's leg ``(EpisodeArrays, key) -> [Q, N]`` over all Q queries of the episode, one jitted call,
  arrays padded to buckets (N to a multiple of 128, Q of 32, vocabulary of 512) so that a handful of shapes
  compile; compile + one warm-up call are excluded; the round's sample is the median of ``--repeats`` calls.
  float32.
  Legs compute what they need inside the call (the CFS-R family its episode Gram, Tide its base scores).
* Reference: the loop-based float64 NumPy code of :mod:`engram_jax.testing.reference`, one query at a time, via
  the adapters of :data:`REFERENCES` (an operator without an adapter is timed on the JAX side only and printed
  with ratio ``n/a``). With ``--ref-queries R`` only the first R queries of each episode are timed and the time is
  scaled by Q / R (the references are per query, so the cost is linear in Q).
* ``rrf``: :func:`engram_jax.ops.rrf.rrf_fuse` (not a leg operator) over the legs of :data:`RRF_STACK` (the CFS-R
  page's stack: cosine, BM25, CFS-R top-50 weighted 3), whose leg scores are computed outside the timer.
* BM25 peers (with ``bm25`` in ``--ops``): ``rank_bm25.BM25Okapi.get_scores`` and bm25s (an optional extra:
  ``engram_jax[bench]``; without it the row says unavailable) on all queries of the episode, one query at a time,
  with the bm25 row's tokens (:func:`engram_jax.ops.bm25.tokenize`), k1 and b; their indexes are built outside
  the timer; ratio = peer / JAX bm25. bm25s runs ``method='atire', idf_method='robertson'``, the closest of its
  variants to BM25Okapi: equal scores except for terms in more than half the documents (idf 0 there, rank_bm25
  ``epsilon * mean idf``), so its agreement is top-10, not equality (see :func:`_bm25s_peer`).
* ``agree``: the fraction of reference-timed queries whose JAX top-10 ids (in order, ties to the later item)
  equal the reference's (the peer's for a peer row), from the first round: the same picks for the greedy
  operators; float32 vs float64 can flip near-ties.

Scale (``--scale``, :func:`time_scale`): one synthetic episode per size N (``--scale-n``, default 1e3, 3e3, 1e4,
3e4, 1e5 items; D = 384; ``--scale-queries`` questions, 64; texts from a Zipf vocabulary, :func:`scale_episode`)
and, per operator of ``--scale-ops`` (cosine, bm25, rrf = RRF of cosine and BM25, cfs, cfsr, tide, with the knob
values above), the jitted top-10 of :func:`engram_jax.pipeline.pipeline_topk` -- the evaluation's path -- timed
after compile and warm-up in ``--rounds`` rounds (at least 3). Each line: N, ms per query (median (min-max) over
rounds), XLA's static peak memory of the compiled call (arguments + temps + outputs) and its temps; then per
operator the growth exponent (least-squares slope of log time against log N) and the check at N = ``--check-n``
(1e3): identical top-10 ids from the scale path (the episode padded past ``GRAM_ITEMS``, so that CFS / CFS-R take
their branch without an N x N Gram) and from the ordinary one. Text operators are skipped, with the reason, where
the episode arrays would hold a dense ``[N, V]`` term-count matrix above ``--dense-budget-gb``.
"""

from __future__ import annotations

import argparse
import ast
import functools
import importlib
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from engram_jax import batch, pipeline
from engram_jax.ops import OPERATORS
from engram_jax.ops import bm25 as bm25_ops
from engram_jax.ops import greedy as greedy_ops
from engram_jax.ops import rrf as rrf_ops
from engram_jax.testing import reference as ref
from engram_jax.types import Episode, Item, Question

FUSION = 'rrf'  # the fusion row's name in --ops and in the table
# Locked seed setups (the CFS / CFS-R / Tide pages) where they differ from the declarations' defaults.
OVERRIDES: dict[str, dict[str, Any]] = {
    'mmr': {'pool': 50},                    # greedy operators: cosine prefilter of 50
    'cfs': {'pool': 50},
    'tide': {'pool': 50, 'recency': 0.1},   # Tide page: base top-50, weight 0.1
}
# The CFS-R page's stack whose legs RRF fuses (a pipeline's legs node).
RRF_STACK: dict[str, dict[str, Any]] = {'cos': {'op': 'cosine'}, 'bm25': {'op': 'bm25'},
                                        'cfsr': {'op': 'cfsr', 'depth': 50, 'weight': 3.0}}
PAD = {'n_multiple': 128, 'q_multiple': 32, 'v_multiple': 512}
TOP = 10  # agreement compares the top-10 ids


class BenchEpisode(NamedTuple):
  """One benchmark episode: the episode and its unit-norm embeddings ``docs [N, D]``, ``queries [Q, D]``."""

  episode: Episode
  docs: np.ndarray
  queries: np.ndarray


# ----------------------------------------------------------------------------------------------
# Episodes.


def synthetic_episodes(*, n_episodes: int = 10, n_queries: int = 200, dim: int = 384, seed: int = 0,
                       vocab: int = 3000, n_items: tuple[int, int] = (370, 690)) -> list[BenchEpisode]:
  """LoCoMo-sized random episodes: N in ``n_items`` (inclusive; LoCoMo: 370..690), ``n_queries`` questions.

  Items are unit vectors with a shared mean direction (cosines around 0.2, like sentence embeddings);
  each query is a noisy copy of a random item (its gold). Texts are Zipf-distributed words ``w<i>``; a query
  borrows up to 4 tokens of its source item.
  """
  rng = np.random.default_rng(seed)
  words = [f'w{i}' for i in range(vocab)]
  zipf = 1.0 / np.arange(1, vocab + 1)
  zipf /= zipf.sum()
  mean = rng.normal(size=dim)
  mean /= np.linalg.norm(mean)
  out = []
  for e in range(n_episodes):
    n = int(rng.integers(n_items[0], n_items[1] + 1))
    docs = 0.5 * mean + rng.normal(size=(n, dim)) / math.sqrt(dim)
    docs /= np.linalg.norm(docs, axis=-1, keepdims=True)
    src = rng.integers(0, n, size=n_queries)
    queries = docs[src] + 1.0 * rng.normal(size=(n_queries, dim)) / math.sqrt(dim)
    queries /= np.linalg.norm(queries, axis=-1, keepdims=True)
    doc_tokens = [list(rng.choice(words, size=int(rng.integers(5, 40)), p=zipf)) for _ in range(n)]
    query_tokens = []
    for s in src:
      own = list(rng.choice(doc_tokens[s], size=min(4, len(doc_tokens[s])), replace=False))
      query_tokens.append(own + list(rng.choice(words, size=int(rng.integers(2, 8)), p=zipf)))
    items = tuple(Item(id=f's{e}:{i}', text=' '.join(t), parent=f's{e}:p{i // 20}', position=i)
                  for i, t in enumerate(doc_tokens))
    questions = tuple(Question(id=f's{e}/q{j}', text=' '.join(t), gold=(items[s].id,),
                               gold_parents=(items[s].parent,), category=0)
                      for j, (s, t) in enumerate(zip(src.tolist(), query_tokens)))
    out.append(BenchEpisode(Episode(id=f'synthetic-{e}', items=items, questions=questions),
                            docs.astype(np.float32), queries.astype(np.float32)))
  return out


def locomo_episodes(root: str | None = None, *, cache_dir: str = '.cache',
                    model_id: str | None = None) -> list[BenchEpisode]:
  """The real LoCoMo episodes, item / question texts embedded through the cache (MiniLM by default)."""
  from engram_jax import embed
  from engram_jax.data.locomo import load_locomo

  episodes, _ = load_locomo(root)
  kw = {} if model_id is None else {'model_id': model_id}
  out = []
  for ep in episodes:
    items = [it.text for it in ep.items]
    vecs = embed.embed_texts(items + [q.text for q in ep.questions], cache_dir=cache_dir, **kw)
    out.append(BenchEpisode(ep, vecs[:len(items)], vecs[len(items):]))
  return out


# ----------------------------------------------------------------------------------------------
# References: operator name -> adapter ``(RefEpisode, query index, knob values) -> [N] scores`` over the
# episode's real items (-inf = not ranked); greedy pickers return their picks as leg scores.


class RefEpisode(NamedTuple):
  """One episode as the NumPy references take it (float64, real rows only)."""

  docs: np.ndarray                  # [N, D]
  queries: np.ndarray               # [Q, D]
  doc_tokens: list[list[str]]       # N token lists ('words' tokenizer)
  query_tokens: list[list[str]]     # Q token lists
  positions: np.ndarray             # [N] write order


def ref_episode(b: BenchEpisode) -> RefEpisode:
  return RefEpisode(docs=np.asarray(b.docs, np.float64), queries=np.asarray(b.queries, np.float64),
                    doc_tokens=[bm25_ops.tokenize(it.text) for it in b.episode.items],
                    query_tokens=[bm25_ops.tokenize(q.text) for q in b.episode.questions],
                    positions=np.arange(b.episode.n_items, dtype=np.float64))


def _bm25_ref(e: RefEpisode, i: int, o: Mapping[str, Any]) -> np.ndarray:
  if o.get('tokenizer', 'words') != 'words':
    raise NotImplementedError('the bench reference tokenises with the words tokenizer only')
  return ref.bm25(e.query_tokens[i], e.doc_tokens, k1=o['k1'], b=o['b'], epsilon=o['epsilon'])


def _picks(sel: tuple[np.ndarray, np.ndarray], n: int) -> np.ndarray:
  return ref.selection_scores_ref(sel[0], n)


def _tide_ref(e: RefEpisode, i: int, o: Mapping[str, Any]) -> np.ndarray:
  base = (ref.cosine_scores_ref(e.queries[i], e.docs) if o['base'] == 'cosine'
          else _bm25_ref(e, i, {'k1': o['k1'], 'b': o['b'], 'epsilon': o['epsilon']}))
  return ref.tide_scores_ref(base, e.positions, weight=o['recency'], depth=o['pool'])


def _mem0_ref(e: RefEpisode, i: int, o: Mapping[str, Any]) -> np.ndarray:
  cos = ref.cosine_scores_ref(e.queries[i], e.docs)
  bm = ref.bm25(e.query_tokens[i], e.doc_tokens)
  fused = ref.additive_fuse_ref(cos, bm, max(len(e.query_tokens[i]), 1), threshold=o['threshold'], pool=o['pool'])
  return np.where(np.isneginf(fused), -10.0 + cos, fused)  # the leg's equal-k backfill (engram_jax.ops.controls)


REFERENCES: dict[str, Callable[[RefEpisode, int, Mapping[str, Any]], np.ndarray]] = {
    'cosine': lambda e, i, o: ref.cosine_scores_ref(e.queries[i], e.docs),
    'bm25': _bm25_ref,
    'mmr': lambda e, i, o: _picks(ref.mmr_select_ref(e.queries[i], e.docs, k=o['k'], lam=o['lam'], pool=o['pool']),
                                  e.docs.shape[0]),
    'cfs': lambda e, i, o: _picks(ref.cfs_select_ref(e.queries[i], e.docs, k=o['k'], beta=o['beta'],
                                                     sigma=o['sigma'], floor=o['floor'], pool=o['pool']),
                                  e.docs.shape[0]),
    'cfsr': lambda e, i, o: ref.cfsr_scores_ref(e.queries[i], e.docs, pool=o['pool'], iterations=o['iterations'],
                                                lam=o['lam'], w=o['w']),
    'tide': _tide_ref,
    'mem0': _mem0_ref,
}


def top_ids(scores: np.ndarray, k: int = TOP) -> list[int]:
  """The top-``k`` ids of the finite entries of ``scores [N]`` (ties to the later item)."""
  scores = np.asarray(scores, np.float64)
  return ref.order_later_wins(scores, np.flatnonzero(np.isfinite(scores)).tolist())[:k]


# ----------------------------------------------------------------------------------------------
# BM25 peers: other BM25 implementations timed on the same queries as the JAX ``bm25`` row.


class Peer(NamedTuple):
  """A BM25 peer: ``build(doc_tokens, k1, b, epsilon) -> score(query_tokens) -> [N]`` (the index is built outside
  the timer), or None with ``why`` when the library is not importable."""

  name: str
  build: Callable[[list[list[str]], float, float, float], Callable[[list[str]], np.ndarray]] | None
  why: str = ''


def _rank_bm25_peer() -> Peer:
  name = 'bm25 (rank_bm25)'
  try:
    import rank_bm25
  except ImportError as e:
    return Peer(name, None, f'rank_bm25 not importable ({e})')

  def build(docs, k1, b, epsilon):
    return rank_bm25.BM25Okapi(docs, k1=k1, b=b, epsilon=epsilon).get_scores
  return Peer(name, build)


def _bm25s_peer() -> Peer:
  """bm25s: a sparse (CSC) matrix of precomputed per-(term, doc) scores; a query sums its terms' columns.

  ``method='atire'`` (term part ``tf (k1 + 1) / (tf + k1 (1 - b + b |d| / avgdl))``, as Okapi) with
  ``idf_method='robertson'`` (``log((n - df + 0.5) / (df + 0.5))``) is the closest of its variants to
  ``BM25Okapi``: equal scores, except that a term in more than half the documents gets idf 0 where rank_bm25
  gives it ``epsilon * mean idf``. (``method='robertson'`` also drops the constant ``k1 + 1``; ``'lucene'`` uses
  ``log(1 + ...)``.) Timed path: ``get_scores(tokens)`` per query (the full ``[N]`` scores, like the other rows;
  its batched ``retrieve`` adds top-k selection and a thread pool, and is slower on these small episodes).
  """
  name = 'bm25 (bm25s)'
  try:
    import bm25s
  except ImportError as e:
    return Peer(name, None, f'bm25s not installed ({e}); pip install "engram_jax[bench]"')

  def build(docs, k1, b, epsilon):
    del epsilon  # bm25s floors negative idf at 0
    index = bm25s.BM25(k1=k1, b=b, method='atire', idf_method='robertson')
    index.index(docs, show_progress=False)
    zeros = np.zeros(len(docs), np.float32)
    return lambda q: index.get_scores(q) if q else zeros
  return Peer(name, build)


PEERS: dict[str, Callable[[], Peer]] = {'rank_bm25': _rank_bm25_peer, 'bm25s': _bm25s_peer}
PEER_OF = 'bm25'  # the JAX row the peers are compared with


def available_peers() -> list[Peer]:
  return [make() for make in PEERS.values()]


# ----------------------------------------------------------------------------------------------
# The benchmark.


def _time_jax(fn: Callable[[], jax.Array], repeats: int) -> tuple[float, jax.Array]:
  """Median seconds of ``repeats`` calls (compiled and warmed up beforehand), and the last output."""
  times = []
  out = None
  for _ in range(max(repeats, 1)):
    t = time.perf_counter()
    out = jax.block_until_ready(fn())
    times.append(time.perf_counter() - t)
  return float(np.median(times)), out


def _time_ref(fn: Callable[[int], np.ndarray], n_queries: int) -> tuple[float, list[np.ndarray]]:
  """Seconds of one pass of ``fn`` over queries ``0 .. n_queries - 1``, and the outputs."""
  t = time.perf_counter()
  out = [fn(i) for i in range(n_queries)]
  return time.perf_counter() - t, out


def operator_options(name: str, overrides: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
  """The knob values the bench times operator ``name`` with: its defaults, then :data:`OVERRIDES`, then
  ``overrides`` (validated by the declaration)."""
  given = {**OVERRIDES.get(name, {}), **(overrides or {}).get(name, {})}
  return OPERATORS[name].options(given, where=f'bench {name}')


def _row(name: str, options: Mapping[str, Any], has_ref: bool, rounds: int) -> dict[str, Any]:
  return {'op': name, 'options': dict(options), 'jax_s': 0.0, 'ref_s': 0.0 if has_ref else None, 'agree': 0,
          'checked': 0, 'ratio': None, 'episodes': 0, 'queries': 0, 'peer_of': None, 'unavailable': None,
          'jax_rounds': [0.0] * rounds, 'ref_rounds': [0.0] * rounds if has_ref else None, 'ratio_rounds': None}


def spread(values: Sequence[float] | None) -> dict[str, float] | None:
  """Median, min, max, quartiles of ``values`` (None for None / empty)."""
  if not values:
    return None
  v = np.asarray(values, np.float64)
  q1, med, q3 = np.percentile(v, [25, 50, 75])
  return {'median': float(med), 'min': float(v.min()), 'max': float(v.max()), 'q1': float(q1), 'q3': float(q3)}


def time_operators(episodes: Sequence[BenchEpisode], names: Sequence[str] | None = None, *, repeats: int = 5,
                   rounds: int = 5, ref_queries: int = 40, overrides: Mapping[str, Mapping[str, Any]] | None = None,
                   peers: bool = True, seed: int = 0,
                   log: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
  """Time operators (registered names, or :data:`FUSION` for RRF) on every episode; one row per name, then the
  BM25 peer rows.

  The two sides are interleaved: all episodes are prepared (padded, compiled, warmed up) first; then, in each of
  ``rounds`` rounds, every episode and operator is timed on the JAX side and on the reference side back to back,
  JAX first in even rounds and the reference first in odd ones (so a drift in machine load hits both). A round's
  time is the sum over episodes; each row reports the median over rounds, and the per-round samples.

  Args:
    episodes: the benchmark episodes.
    names: registered operator names and/or ``'rrf'``; None = every registered operator, then ``'rrf'``.
    repeats: JAX calls per operator, episode and round (their median is the round's JAX sample).
    rounds: interleaved rounds (samples per side).
    ref_queries: reference-timed queries per episode (0 = all); the time is scaled to all queries.
    overrides: ``{operator: {knob: value}}`` over the bench's knob values (:func:`operator_options`).
    peers: with ``'bm25'`` in ``names``, also time the :data:`PEERS` (rank_bm25, bm25s) on all queries of every
      episode, with the bm25 row's k1 / b / epsilon and tokens; a peer that is not importable gets a row with
      ``unavailable`` set and no times.
    seed: the PRNG key of the legs (only stochastic legs such as cos2 read it).
    log: called with one progress line per episode and per round.

  Returns:
    One dict per name, in order, then one per peer: ``op``, ``options`` (knob values), ``jax_s`` (median over
    rounds of the time summed over episodes), ``ref_s`` (the same for the reference, scaled to all queries, or the
    peer; None without one), ``ratio`` (median over rounds of ``ref / jax``, or None), ``jax_rounds`` /
    ``ref_rounds`` / ``ratio_rounds`` (the per-round samples), ``agree`` / ``checked`` (queries whose top-10 ids
    agree / queries compared, first round), ``episodes``, ``queries``, ``peer_of`` (``'bm25'`` for a peer row,
    whose JAX side is the bm25 row's), ``unavailable`` (why a peer was not timed).

  Raises:
    ValueError: an unknown operator name (listing the registered ones) or an invalid knob value.
  """
  names = [*OPERATORS, FUSION] if names is None else list(names)
  unknown = [n for n in names if n not in OPERATORS and n != FUSION]
  if unknown:
    raise ValueError(f'unknown operators {unknown}; registered: {sorted(OPERATORS)} (and {FUSION!r}, the fusion)')
  unknown = sorted(set(overrides or {}) - set(OPERATORS))
  if unknown:
    raise ValueError(f'knob overrides for unknown operators {unknown}; registered: {sorted(OPERATORS)}')
  rounds = max(int(rounds), 1)
  key = jax.random.key(seed)
  legs = {n: pipeline.make_pipeline(name=n, legs={n: {'op': n, **operator_options(n, overrides)}}).legs[0]
          for n in names if n != FUSION}
  stack = pipeline.make_pipeline(name=FUSION, fusion='rrf', legs=RRF_STACK) if FUSION in names else None
  built = pipeline.build_options([pipeline.Pipeline(legs=(leg,)) for leg in legs.values()]
                                 + ([stack] if stack is not None else []))
  fns = {n: jax.jit(leg.score) for n, leg in legs.items()}
  rows = {n: _row(n, legs[n].options if n in legs else {}, n in REFERENCES or n == FUSION, rounds) for n in names}
  if stack is not None:
    stack_fns = [jax.jit(leg.score) for leg in stack.legs]
    weights = jnp.asarray([leg.weight for leg in stack.legs])
    depths = [leg.depth for leg in stack.legs]
    fuse = jax.jit(lambda s, where: rrf_ops.rrf_fuse(s, weights=weights, depths=depths, where=where, k0=stack.k0))
    rows[FUSION]['options'] = {'legs': {leg.name: leg.op for leg in stack.legs}, 'weights': weights.tolist(),
                               'depths': depths, 'k0': stack.k0}
  peer_list = available_peers() if peers and PEER_OF in legs else []
  peer_rows = {}
  for p in peer_list:
    opts = {k: dict(legs[PEER_OF].options)[k] for k in ('k1', 'b', 'epsilon')}
    row = _row(p.name, opts, p.build is not None, rounds)
    row['peer_of'] = PEER_OF
    row['jax_rounds'] = None
    row['high_df_queries'] = 0  # queries with a term in more than half the documents (bm25s's idf differs there)
    if p.build is None:
      row['unavailable'] = p.why
    peer_rows[p.name] = row
  if peer_list and dict(legs[PEER_OF].options).get('tokenizer', 'words') != 'words':
    raise ValueError('the BM25 peers tokenise with the words tokenizer only')

  # Preparation: pad, compile and warm up every (episode, operator); build the peers' indexes.
  prepared = []  # per episode: (q, r_q, {name: (jax thunk, reference fn or None)}, {peer: score fn})
  for e_i, b in enumerate(episodes):
    arr = batch.episode_arrays(b.episode, b.docs, b.queries, **PAD, **built)
    n, q = b.episode.n_items, len(b.episode.questions)
    r_q = q if ref_queries <= 0 else min(q, ref_queries)
    e_ref = ref_episode(b)
    timed = {}
    for name in names:
      if name == FUSION:
        stacked = jnp.stack([f(arr, key) for f in stack_fns])  # outside the timer
        s64 = np.asarray(stacked, np.float64)[:, :q, :n]
        thunk = (lambda st, w: lambda: fuse(st, w))(stacked, arr.where)
        fn_ref = (lambda s: lambda i: ref.rrf_fuse_ref(s[:, i], [l.weight for l in stack.legs], depths,
                                                      k0=stack.k0))(s64)
      else:
        thunk = (lambda f, a: lambda: f(a, key))(fns[name], arr)
        adapter = REFERENCES.get(name)
        opts = dict(legs[name].options)
        fn_ref = None if adapter is None else (lambda ad, ee, o: lambda i: ad(ee, i, o))(adapter, e_ref, opts)
      jax.block_until_ready(thunk())  # compile + warm-up
      timed[name] = (thunk, fn_ref)
      rows[name]['episodes'] += 1
      rows[name]['queries'] += q
    scorers = {}
    df: dict[str, int] = {}
    for d in e_ref.doc_tokens:
      for t in set(d):
        df[t] = df.get(t, 0) + 1
    high_df = sum(any(2 * df.get(t, 0) > n for t in toks) for toks in e_ref.query_tokens)
    for p in peer_list:
      row = peer_rows[p.name]
      row['episodes'] += 1
      row['queries'] += q
      row['high_df_queries'] += high_df
      if p.build is not None:
        o = row['options']
        score = p.build(e_ref.doc_tokens, o['k1'], o['b'], o['epsilon'])  # the index, outside the timer
        scorers[p.name] = (lambda s, toks: lambda i: s(toks[i]))(score, e_ref.query_tokens)
    prepared.append((n, q, r_q, timed, scorers))
    if log is not None:
      log(f'episode {e_i + 1}/{len(episodes)}: N={n} (padded {arr.docs.shape[0]}), Q={q} (padded '
          f'{arr.queries.shape[0]}), reference on {r_q} queries')

  # Interleaved rounds.
  for r in range(rounds):
    jax_first = r % 2 == 0
    for n, q, r_q, timed, scorers in prepared:
      for name in names:
        row = rows[name]
        thunk, fn_ref = timed[name]
        got = want = None
        if fn_ref is not None and not jax_first:
          ref_s, want = _time_ref(fn_ref, r_q)
        jax_s, out = _time_jax(thunk, repeats)
        if fn_ref is not None and jax_first:
          ref_s, want = _time_ref(fn_ref, r_q)
        row['jax_rounds'][r] += jax_s
        if fn_ref is not None:
          row['ref_rounds'][r] += ref_s * q / r_q
        if r == 0:
          got = np.asarray(out)[:q, :n]
          if fn_ref is not None:
            row['agree'] += sum(top_ids(got[i]) == top_ids(want[i]) for i in range(r_q))
            row['checked'] += r_q
        if name == PEER_OF:
          for p_name, fn_peer in scorers.items():
            p_s, p_out = _time_ref(fn_peer, q)
            peer_rows[p_name]['ref_rounds'][r] += p_s
            if r == 0:
              peer_rows[p_name]['agree'] += sum(top_ids(got[i]) == top_ids(p_out[i]) for i in range(q))
              peer_rows[p_name]['checked'] += q
    if log is not None:
      log(f'round {r + 1}/{rounds} ({"JAX" if jax_first else "reference"} first)')

  for row in rows.values():
    row['jax_s'] = spread(row['jax_rounds'])['median']
    if row['ref_rounds'] is not None:
      row['ref_s'] = spread(row['ref_rounds'])['median']
      if all(t > 0 for t in row['jax_rounds']):
        row['ratio_rounds'] = [a / t for a, t in zip(row['ref_rounds'], row['jax_rounds'])]
        row['ratio'] = spread(row['ratio_rounds'])['median']
  for row in peer_rows.values():
    base = rows[PEER_OF]
    row['jax_s'] = base['jax_s']
    row['jax_rounds'] = list(base['jax_rounds'])
    if row['ref_rounds'] is not None:
      row['ref_s'] = spread(row['ref_rounds'])['median']
      if all(t > 0 for t in row['jax_rounds']):
        row['ratio_rounds'] = [a / t for a, t in zip(row['ref_rounds'], row['jax_rounds'])]
        row['ratio'] = spread(row['ratio_rounds'])['median']
  return [rows[n] for n in names] + list(peer_rows.values())


# ----------------------------------------------------------------------------------------------
# Output.


def environment() -> list[str]:
  """The JAX devices and the BLAS / XLA thread settings (what the times depend on)."""
  dev = jax.devices()[0]
  return [f'jax {jax.__version__}, numpy {np.__version__}; device {dev} ({dev.platform}, '
          f'{jax.device_count()} device(s)); x64 {bool(jax.config.jax_enable_x64)}', device_settings(),
          thread_settings()]


def device_settings() -> str:
  """One line: every device JAX sees (``jax.devices()``), with its platform and kind; the operator times run on
  the first (the default device), a sharded evaluation (``eval.devices``) on all of them."""
  kinds = ', '.join(f'{d} [{d.platform}, {d.device_kind}]' for d in jax.devices())
  return f'devices: {jax.default_backend()} backend, {jax.device_count()} device(s): {kinds}'


def thread_settings() -> str:
  """One line: the XLA / BLAS thread settings the times depend on (printed beside the table)."""
  try:
    usable = len(os.sched_getaffinity(0))
  except AttributeError:  # not on Linux
    usable = os.cpu_count()
  env = ', '.join(f'{k}={os.environ.get(k, "unset")}' for k in ('XLA_FLAGS', 'OMP_NUM_THREADS',
                                                                  'OPENBLAS_NUM_THREADS', 'MKL_NUM_THREADS'))
  try:
    from threadpoolctl import threadpool_info
    pools = ', '.join(f'{p.get("internal_api")}={p.get("num_threads")}' for p in threadpool_info()) or 'none loaded'
  except ImportError:
    pools = 'unknown (threadpoolctl not installed)'
  return f'threads: {usable}/{os.cpu_count()} CPUs usable; {env}; BLAS pools: {pools}'


def _cell(values: Sequence[float] | None, scale: float = 1e3, fmt: str = '{:.1f}', unit: str = '') -> str:
  s = spread(values)
  if s is None:
    return 'n/a'
  f = lambda v: fmt.format(scale * v) + unit
  return f'{f(s["median"])} ({f(s["min"])}-{f(s["max"])})'


def format_table(rows: Sequence[Mapping[str, Any]], *, n_episodes: int, n_queries: int,
                 threads: str | None = None) -> str:
  """Markdown: one line per row, median over rounds with (min-max); ``n/a`` where an operator has no reference.
  A peer row (``peer_of`` set) compares the JAX row it names with the peer library; ``threads``
  (:func:`thread_settings` by default) is printed under the table."""
  n_rounds = max((len(r['jax_rounds'] or []) for r in rows), default=0)
  lines = [f'{n_episodes} episodes, {n_queries} queries, {n_rounds} interleaved rounds; times are totals over all '
           'queries, median (min-max) over rounds (JAX float32 jitted; NumPy float64 reference, or the peer library)',
           '| op | JAX ms | reference / peer ms | ratio | agree |', '|---|---:|---:|---:|---:|']
  for r in rows:
    if r.get('unavailable'):
      lines.append(f'| {r["op"]} | {_cell(r["jax_rounds"])} | unavailable | n/a | n/a |')
      continue
    has = r['ref_s'] is not None
    agree = f'{r["agree"]}/{r["checked"]}' if has else 'n/a'
    jax_cell = _cell(r['jax_rounds']) if r['jax_rounds'] is not None else 'n/a'
    if r.get('peer_of'):
      jax_cell = f'({r["peer_of"]}) {jax_cell}'
    lines.append(f'| {r["op"]} | {jax_cell} | {_cell(r["ref_rounds"])} | '
                 f'{_cell(r["ratio_rounds"], 1.0, "{:.1f}", "x")} | {agree} |')
  notes = [f'- {r["op"]}: unavailable: {r["unavailable"]}' for r in rows if r.get('unavailable')]
  peer_rows = [r for r in rows if r.get('peer_of')]
  if peer_rows:
    notes.append('- peer rows: ratio = peer time / JAX bm25 time on the same queries (all of them), index built '
                 'outside the timer; agree = JAX top-10 ids equal to the peer\'s. bm25s: method=atire, '
                 'idf_method=robertson, get_scores per query; it floors the idf of terms in more than half the '
                 'documents at 0 (rank_bm25: epsilon x mean idf), so its scores equal rank_bm25\'s only on queries '
                 f'without such terms; {peer_rows[0]["high_df_queries"]}/{peer_rows[0]["queries"]} queries here '
                 'have one.')
  lines += notes + [threads if threads is not None else thread_settings()]
  return '\n'.join(lines)


def _parse_sets(items: Sequence[str]) -> dict[str, dict[str, Any]]:
  """``['tide.pool=10', 'cfsr.batch_size=None']`` -> ``{'tide': {'pool': 10}, 'cfsr': {'batch_size': None}}``."""
  out: dict[str, dict[str, Any]] = {}
  for item in items:
    path, sep, raw = item.partition('=')
    op, dot, knob = path.partition('.')
    if not sep or not dot:
      raise ValueError(f'--set expects OP.KNOB=VALUE, got {item!r}')
    try:
      value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
      value = raw
    out.setdefault(op, {})[knob] = value
  return out


def harness(overrides: Sequence[str], *, rounds: int, out_dir: str | None = None) -> list[dict[str, Any]]:
  """The whole evaluation path, timed: ``experiments.evaluate.run`` on ``conf/config.yaml`` + ``overrides``,
  ``rounds`` times in this process (the first round warms the embedding and compilation caches).

  Returns one row per round: end-to-end wall time of ``run`` (config checks, loading, embedding through the
  cache, retrieval, metrics, statistics, report files), the time inside the jitted retrieval calls (``retrieve``,
  compilation included), the XLA compilations and the overhead ratio ``wall / retrieve``.
  """
  import tempfile  # pylint: disable=import-outside-toplevel
  from hydra import compose, initialize_config_dir  # pylint: disable=import-outside-toplevel
  from experiments import evaluate  # pylint: disable=import-outside-toplevel

  conf = str(Path(__file__).resolve().parents[1] / 'conf')
  with initialize_config_dir(config_dir=conf, version_base='1.3'):
    cfg = compose(config_name='config', overrides=['eval.progress=false', *overrides])
  rows = []
  for r in range(rounds):
    folder = Path(out_dir or tempfile.mkdtemp(prefix='engram_harness_')) / f'round{r}'
    t0 = time.perf_counter()
    evaluate.run(cfg, folder)
    wall = time.perf_counter() - t0
    t = json.loads((folder / 'run_info.json').read_text())['timing']
    retrieve = t['phases_s'].get('retrieve', 0.0)
    rows.append({'round': r, 'wall_s': wall, 'retrieve_s': retrieve, 'phases_s': t['phases_s'],
                 'xla_compilations': t['xla_compilations'], 'overhead_ratio': wall / retrieve if retrieve else None})
  return rows


def format_harness(rows: Sequence[Mapping[str, Any]]) -> str:
  phases = list(rows[0]['phases_s'])
  head = ['round', 'wall s', *[f'{p} s' for p in phases], 'XLA compilations', 'overhead ratio (wall / retrieve)']
  lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
  for r in rows:
    ratio = f"{r['overhead_ratio']:.2f}" if r['overhead_ratio'] else 'n/a'
    lines.append(f"| {r['round']} | {r['wall_s']:.2f} | " + ' | '.join(f"{r['phases_s'][p]:.2f}" for p in phases)
                 + f" | {r['xla_compilations']} | {ratio} |")
  warm = [r['overhead_ratio'] for r in rows[1:] if r['overhead_ratio']]
  if warm:
    lines.append(f'\nwarm rounds: median overhead ratio {statistics.median(warm):.2f} (round 0 warms the caches)')
  return '\n'.join(lines)


# ----------------------------------------------------------------------------------------------
# Scale: operator cost versus episode size N (one synthetic episode per N).

SCALE_NS = (1_000, 3_000, 10_000, 30_000, 100_000)
SCALE_OPS = ('cosine', 'bm25', 'rrf', 'cfs', 'cfsr', 'tide')
SCALE_RRF = {'cos': {'op': 'cosine'}, 'bm25': {'op': 'bm25'}}  # conf/pipeline/rrf_cos_bm25.yaml
TEXT_OPS = ('bm25', 'mem0')  # operators that read the texts (besides a Tide with a BM25 base)
CHECK_N = 1_000  # where the scale path is checked against the ordinary one
TOP_K = 10


def scale_episode(n_items: int, n_queries: int, *, dim: int = 384, vocab: int = 50_000, seed: int = 0,
                  texts: bool = True) -> BenchEpisode:
  """One synthetic episode of ``n_items`` items and ``n_queries`` questions, built in O(N) array code.

  Embeddings as in :func:`synthetic_episodes` (unit vectors around a shared mean direction; each query a noisy copy
  of a random item, its gold). Texts: 20-30 words per item drawn from a Zipf(1) vocabulary of ``vocab`` words
  ``w<i>`` (so the distinct words grow with N, about 8k at 1e3 items and 50k at 1e5); a query is 4 words of its
  source item and 4 Zipf words. ``texts=False`` leaves every text empty (for operators that read embeddings only).
  The draw depends on ``(seed, n_items)`` only.
  """
  rng = np.random.default_rng([seed, n_items])
  mean = rng.standard_normal(dim).astype(np.float32)
  mean /= np.linalg.norm(mean)
  docs = 0.5 * mean + rng.standard_normal((n_items, dim), dtype=np.float32) / np.float32(math.sqrt(dim))
  docs /= np.linalg.norm(docs, axis=-1, keepdims=True)
  src = rng.integers(0, n_items, size=n_queries)
  queries = docs[src] + rng.standard_normal((n_queries, dim), dtype=np.float32) / np.float32(math.sqrt(dim))
  queries /= np.linalg.norm(queries, axis=-1, keepdims=True)
  doc_texts, query_texts = [''] * n_items, [''] * n_queries
  if texts:
    cdf = np.cumsum(1.0 / np.arange(1, vocab + 1))
    cdf /= cdf[-1]
    zipf = lambda size: np.minimum(np.searchsorted(cdf, rng.random(size)), vocab - 1)
    words = np.array([f'w{i}' for i in range(vocab)])
    lengths = rng.integers(20, 31, size=n_items)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    ids = zipf(int(starts[-1]))
    doc_texts = [' '.join(words[ids[a:b]]) for a, b in zip(starts[:-1], starts[1:])]
    own = ids[starts[src][:, None] + (rng.random((n_queries, 4)) * lengths[src][:, None]).astype(np.int64)]
    q_ids = np.concatenate([own, zipf((n_queries, 4))], axis=1)
    query_texts = [' '.join(words[row]) for row in q_ids]
  items = tuple(Item(id=f'i{i}', text=t, parent=f'p{i // 20}', position=i) for i, t in enumerate(doc_texts))
  questions = tuple(Question(id=f'q{j}', text=t, gold=(f'i{s}',), gold_parents=(f'p{s // 20}',), category=0)
                    for j, (s, t) in enumerate(zip(src.tolist(), query_texts)))
  return BenchEpisode(Episode(id=f'scale-{n_items}', items=items, questions=questions), docs, queries)


def scale_pipelines(names: Sequence[str] = SCALE_OPS,
                    overrides: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, pipeline.Pipeline]:
  """The pipeline each scale row runs: a registered operator alone with the bench's knob values
  (:func:`operator_options`: Tide pool 50 / recency 0.1, CFS pool 50), or :data:`FUSION` = RRF of cosine and BM25
  (``rrf_cos_bm25``: depth 10 each, k0 60).

  Raises:
    ValueError: an unknown name or an invalid knob value.
  """
  out = {}
  for name in names:
    if name == FUSION:
      legs = {leg: {**node, **operator_options(node['op'], overrides)} for leg, node in SCALE_RRF.items()}
      out[name] = pipeline.make_pipeline(name=name, fusion='rrf', legs=legs)
    elif name in OPERATORS:
      out[name] = pipeline.make_pipeline(name=name, legs={name: {'op': name, **operator_options(name, overrides)}})
    else:
      raise ValueError(f'unknown scale op {name!r}; choose from {sorted(OPERATORS) + [FUSION]}')
  return out


def reads_text(pipe: pipeline.Pipeline) -> bool:
  """Whether a pipeline reads the texts (a BM25 leg, or an operator built on BM25), not only the embeddings."""
  return any(leg.op in TEXT_OPS or leg.operator.needs is not None or dict(leg.options).get('base') == 'bm25'
             for leg in pipe.legs)


class TermLayout(NamedTuple):
  """How :func:`engram_jax.batch.episode_arrays` stores BM25 term counts, read off a one-item probe."""

  dense: bool    # a dense ``doc_tf [N, V]`` array (else a sparse layout, whose size does not grow with N x V)
  itemsize: int  # bytes per dense entry (0 when not dense)


def term_layout() -> TermLayout:
  """Probe the episode arrays' BM25 representation: dense ``[N, V]`` (then the scale table caps BM25's N) or not."""
  probe = Episode(id='probe', items=(Item(id='a', text='w', parent='p', position=0),),
                  questions=(Question(id='q', text='w', gold=('a',), gold_parents=('p',), category=0),))
  arr = batch.episode_arrays(probe, np.ones((1, 4), np.float32), np.ones((1, 4), np.float32))
  tf = getattr(arr, 'doc_tf', None)
  dense = isinstance(tf, (np.ndarray, jax.Array)) and tf.ndim == 2 and tf.shape[0] == arr.docs.shape[0]
  return TermLayout(dense, int(tf.dtype.itemsize) if dense else 0)


def dense_term_bytes(b: BenchEpisode, layout: TermLayout) -> int:
  """Bytes of the dense ``[N, V]`` term counts :func:`engram_jax.batch.episode_arrays` would build for ``b``, before
  padding (a lower bound): real items x distinct ``words`` tokens of the items; 0 for a sparse layout."""
  if not layout.dense:
    return 0
  vocab = set()
  for it in b.episode.items:
    vocab.update(bm25_ops.tokenize(it.text))
  return b.episode.n_items * len(vocab) * layout.itemsize


def xla_memory(compiled: Any) -> dict[str, int] | None:
  """XLA's static buffer analysis of a compiled call: ``{'args', 'temps', 'outputs', 'peak'}`` bytes (peak =
  args + temps + outputs - aliased), or None when the backend gives none."""
  try:
    m = compiled.memory_analysis()
  except (NotImplementedError, AttributeError, RuntimeError):
    return None
  if m is None:
    return None
  out = {'args': int(m.argument_size_in_bytes), 'temps': int(m.temp_size_in_bytes),
         'outputs': int(m.output_size_in_bytes)}
  out['peak'] = out['args'] + out['temps'] + out['outputs'] - int(getattr(m, 'alias_size_in_bytes', 0))
  return out


def growth_exponent(ns: Sequence[float], times: Sequence[float]) -> float | None:
  """Least-squares slope of log(time) against log(N) (None with fewer than two sizes)."""
  if len(ns) < 2:
    return None
  return float(np.polyfit(np.log(np.asarray(ns, np.float64)), np.log(np.asarray(times, np.float64)), 1)[0])


def _topk_fn(pipe: pipeline.Pipeline) -> Callable[..., jax.Array]:
  return jax.jit(functools.partial(pipeline.pipeline_topk, pipe, k=TOP_K))


def padded_past_gram(b: BenchEpisode, built: Mapping[str, Any]) -> batch.EpisodeArrays:
  """``b``'s arrays padded to more than :data:`engram_jax.ops.greedy.GRAM_ITEMS` items (masked), by the N bucket
  multiple: ``N - 1`` pads to ``2 (N - 1)`` whether the bucket rounds small sizes to the multiple or to a power of
  two; ``GRAM_ITEMS + 1`` where that is not enough.

  Raises:
    ValueError: when neither pads past the threshold (an episode of at most ``GRAM_ITEMS / 2 + 1`` items under a
      power-of-two bucket).
  """
  n = b.episode.n_items
  for multiple in (max(n - 1, 1), greedy_ops.GRAM_ITEMS + 1):
    arr = batch.episode_arrays(b.episode, b.docs, b.queries, n_multiple=multiple, **built)
    if arr.docs.shape[0] > greedy_ops.GRAM_ITEMS:
      return arr
  raise ValueError(f'cannot pad {n} items past GRAM_ITEMS={greedy_ops.GRAM_ITEMS}; check at N >= '
                   f'{greedy_ops.GRAM_ITEMS // 2 + 2}')


def check_scale_path(pipes: Mapping[str, pipeline.Pipeline], *, n_items: int = CHECK_N, n_queries: int = 64,
                     dim: int = 384, seed: int = 0) -> dict[str, tuple[int, int]]:
  """Top-10 ids of the scale path against the ordinary one, per pipeline, on one episode of ``n_items`` items.

  Ordinary: :func:`engram_jax.pipeline.pipeline_topk` on :func:`engram_jax.batch.episode_arrays` with its default
  padding, as ``experiments.evaluate`` runs it (at ``n_items <= GRAM_ITEMS`` the pool operators gather their blocks
  from the episode Gram). Scale path: the same episode padded past :data:`engram_jax.ops.greedy.GRAM_ITEMS`
  (masked items), so that CFS / CFS-R / MMR take their large-N branch (per-query blocks from the pooled rows, no
  N x N Gram), as every size above the threshold does.

  Returns ``{name: (questions with identical top-10 ids, questions)}``.
  """
  b = scale_episode(n_items, n_queries, dim=dim, seed=seed)
  built = pipeline.build_options(pipes.values())
  plain = batch.episode_arrays(b.episode, b.docs, b.queries, **built)
  past = padded_past_gram(b, built)
  key = jax.random.key(seed)
  out = {}
  for name, pipe in pipes.items():
    fn = _topk_fn(pipe)
    want = np.asarray(fn(plain, key))[:n_queries]
    got = np.asarray(fn(past, key))[:n_queries]
    out[name] = (int(np.sum(np.all(got == want, axis=-1))), n_queries)
  return out


def time_scale(ns: Sequence[int] = SCALE_NS, names: Sequence[str] = SCALE_OPS, *, n_queries: int = 64,
               dim: int = 384, rounds: int = 5, repeats: int = 3, dense_budget_gb: float = 1.0,
               overrides: Mapping[str, Mapping[str, Any]] | None = None, check_n: int | None = CHECK_N,
               seed: int = 0, log: Callable[[str], None] | None = None) -> dict[str, Any]:
  """Operator cost versus episode size: for each N in ``ns`` one :func:`scale_episode`, and for each pipeline of
  :func:`scale_pipelines` the jitted top-10 of all its questions (:func:`engram_jax.pipeline.pipeline_topk`, the
  evaluation's path: legs, fusion, cut).

  Per N: the episode is padded (:func:`engram_jax.batch.episode_arrays`, default buckets) and put on the device;
  every pipeline is compiled (its XLA buffer analysis read) and warmed up; then in each of ``rounds`` rounds every
  pipeline is timed (``repeats`` calls, median; the order reversed in odd rounds). Time per query = the call's time
  / ``n_queries``; per-episode work (the CFS / CFS-R Gram at N <= GRAM_ITEMS, BM25's statistics) is shared by the
  ``n_queries`` questions. Padded questions are computed too, so ``n_queries`` should be a bucket size (64).

  Memory: a pipeline that reads texts is skipped at an N where the episode arrays hold a dense ``[N, V]``
  term-count matrix above ``dense_budget_gb`` (its size computed from N and the vocabulary); the other pipelines
  then run on a text-free copy of the episode (same embeddings), whose term counts are empty.

  Returns:
    ``{'rows': [...], 'ops': {name: {'exponent', 'fit_ns', 'exponent_large'}}, 'check': {name: (equal, checked)} or
    None, 'check_n', 'n_queries', 'dim', 'rounds', 'repeats', 'layout', 'options'}`` (``exponent_large``: the fit
    over the sizes padded past GRAM_ITEMS only); a row has ``op``, ``n``, ``n_pad``, ``per_query_rounds`` (seconds per
    query, one per round), ``per_query`` (their median), ``memory`` (:func:`xla_memory`) and ``skipped`` (why, or
    None).
  """
  pipes = scale_pipelines(names, overrides)
  layout = term_layout()
  budget = dense_budget_gb * 2 ** 30
  text = {name: reads_text(p) for name, p in pipes.items()}
  key = jax.random.key(seed)
  rows = []
  for n in ns:
    b = scale_episode(n, n_queries, dim=dim, seed=seed)
    need = dense_term_bytes(b, layout)
    too_big = need > budget
    if too_big:
      b = scale_episode(n, n_queries, dim=dim, seed=seed, texts=False)
    arr = jax.device_put(batch.episode_arrays(b.episode, b.docs, b.queries, **pipeline.build_options(
        [p for name, p in pipes.items() if not (too_big and text[name])])))
    prepared = {}
    for name, pipe in pipes.items():
      row = {'op': name, 'n': n, 'n_pad': int(arr.docs.shape[0]), 'per_query_rounds': [], 'per_query': None,
             'memory': None, 'skipped': None}
      rows.append(row)
      if too_big and text[name]:
        row['skipped'] = f'dense [N, V] term counts would need {need / 2 ** 30:.1f} GB (> {dense_budget_gb:g} GB)'
        continue
      compiled = _topk_fn(pipe).lower(arr, key).compile()
      row['memory'] = xla_memory(compiled)
      thunk = functools.partial(compiled, arr, key)
      jax.block_until_ready(thunk())  # warm-up
      prepared[name] = (row, thunk)
    if log is not None:
      log(f'N={n} (padded {arr.docs.shape[0]}): compiled {list(prepared)}'
          + (f'; dense [N, V] {need / 2 ** 30:.2f} GB' if layout.dense else ''))
    order = list(prepared)
    for r in range(max(int(rounds), 1)):
      for name in (order if r % 2 == 0 else order[::-1]):
        row, thunk = prepared[name]
        t, _ = _time_jax(thunk, repeats)
        row['per_query_rounds'].append(t / n_queries)
    for row, _ in prepared.values():
      row['per_query'] = spread(row['per_query_rounds'])['median']
    del arr, prepared
  ops = {}
  for name in pipes:
    done = [r for r in rows if r['op'] == name and r['per_query'] is not None]
    big = [r for r in done if r['n_pad'] > greedy_ops.GRAM_ITEMS]
    ops[name] = {'exponent': growth_exponent([r['n'] for r in done], [r['per_query'] for r in done]),
                 'fit_ns': [r['n'] for r in done],
                 'exponent_large': growth_exponent([r['n'] for r in big], [r['per_query'] for r in big])}
  check = None
  if check_n is not None:
    check = check_scale_path(pipes, n_items=check_n, n_queries=n_queries, dim=dim, seed=seed)
    if log is not None:
      log(f'checked the scale path at N={check_n}')
  return {'rows': rows, 'ops': ops, 'check': check, 'check_n': check_n, 'n_queries': n_queries, 'dim': dim,
          'rounds': max(int(rounds), 1), 'repeats': repeats, 'layout': layout._asdict(),
          'options': {name: {leg.name: dict(leg.options) for leg in p.legs} for name, p in pipes.items()}}


def _mb(x: int | None) -> str:
  return 'n/a' if x is None else f'{x / 2 ** 20:.1f}'


def format_scale(result: Mapping[str, Any], *, threads: str | None = None) -> str:
  """Markdown: one line per operator and N (time per query, median (min-max) over rounds; XLA peak memory), then
  one line per operator (growth exponent, the check at ``check_n``), with the thread settings under them."""
  lines = [f'Scale: one synthetic episode per N (D={result["dim"]}, {result["n_queries"]} questions, top-{TOP_K} '
           f'by engram_jax.pipeline.pipeline_topk, jitted); ms per query = one call over all questions / questions, '
           f'median (min-max) over {result["rounds"]} rounds of the median of {result["repeats"]} calls, after '
           'compile and warm-up. Memory: XLA peak = static buffer analysis of the compiled call '
           '(arguments + temps + outputs, MB; arguments include the [N, D] embeddings); host RSS is not shown.',
           '', '| op | N | N padded | ms / query | XLA peak MB | temps MB |', '|---|---:|---:|---:|---:|---:|']
  for r in result['rows']:
    if r['skipped']:
      lines.append(f'| {r["op"]} | {r["n"]} | {r["n_pad"]} | skipped: {r["skipped"]} | | |')
      continue
    m = r['memory'] or {}
    lines.append(f'| {r["op"]} | {r["n"]} | {r["n_pad"]} | {_cell(r["per_query_rounds"], 1e3, "{:.3f}")} | '
                 f'{_mb(m.get("peak"))} | {_mb(m.get("temps"))} |')
  check = result.get('check')
  at = f'at N={result["check_n"]}' if check else '(not checked)'
  lines += ['', f'| op | growth exponent | N fitted | exponent, N > {greedy_ops.GRAM_ITEMS} | top-{TOP_K} equal {at} |',
            '|---|---:|---|---:|---:|']
  fmt = lambda e: 'n/a' if e is None else f'{e:.2f}'
  for name, o in result['ops'].items():
    eq = 'n/a' if not check or name not in check else f'{check[name][0]}/{check[name][1]}'
    lines.append(f'| {name} | {fmt(o["exponent"])} | {", ".join(str(n) for n in o["fit_ns"])} | '
                 f'{fmt(o["exponent_large"])} | {eq} |')
  lines += ['', '- growth exponent: least-squares slope of log(ms / query) against log(N) over the sizes measured; '
            f'"N > {greedy_ops.GRAM_ITEMS}": over the sizes above the Gram threshold only (at or below it CFS / '
            'CFS-R compute the N x N episode Gram once per episode, a per-episode cost shared by the questions).',
            f'- top-{TOP_K} equal: questions whose ids from the scale path (the episode padded past '
            f'GRAM_ITEMS={greedy_ops.GRAM_ITEMS}, so CFS / CFS-R compute per-query pool blocks, no N x N Gram) equal '
            'those of the ordinary path (default padding, as experiments.evaluate; Gram gathered).',
            f'- options: ' + '; '.join(f'{n}: {o}' for n, o in result['options'].items()),
            threads if threads is not None else thread_settings()]
  return '\n'.join(lines)


def scale_main(args: argparse.Namespace, ap: argparse.ArgumentParser) -> dict[str, Any]:
  """``--scale``: time, print and optionally write (``--out``) the scale table."""
  try:
    ns = [int(float(n)) for n in args.scale_n.split(',') if n]
    names = [o for o in args.scale_ops.split(',') if o]
    overrides = _parse_sets(args.set)
    scale_pipelines(names, overrides)  # validates names and knob values
  except ValueError as e:
    ap.error(str(e))
  print('\n'.join(environment()))
  result = time_scale(ns, names, n_queries=args.scale_queries, rounds=max(args.rounds, 3), repeats=args.repeats,
                      dense_budget_gb=args.dense_budget_gb, overrides=overrides, check_n=args.check_n or None,
                      log=lambda s: print(s, file=sys.stderr))
  table = format_scale(result)
  print(table)
  if args.out:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text('\n'.join(environment()) + '\n\n' + table + '\n')
    out.with_suffix('.json').write_text(json.dumps(result, indent=1, default=str))
  return result


# ----------------------------------------------------------------------------------------------
# CFS-R against its arithmetic floor (LoCoMo): the full leg, its parts, and the solver's batched matvecs alone.


def cfsr_floor(episodes: Sequence[BenchEpisode], *, repeats: int = 5, batch_size: int = 16,
               pool: int = 150, iterations: int = 80, power_iterations: int = 20) -> dict[str, Any]:
  """Times, over all ``episodes`` (after warm-up, median of ``repeats``):

  * ``leg``: the CFS-R leg as the evaluation runs it (cosine, top-P pool, Gram blocks, projected gradient);
  * ``pool``: its pool step alone (cosine, top-P, the P x P blocks gathered from the episode Gram);
  * ``solve``: the solver alone on the gathered blocks (``power_iterations`` + ``iterations`` batched P x P
    matvecs per query, in chunks of ``batch_size`` queries, the leg's chunking);
  * ``gemm``: a dense matmul of the same FLOP count, for this machine's compute rate.

  FLOPs: ``2 P^2 (iterations + power_iterations)`` per query (the matvecs; everything else is O(P)). Bytes: each
  matvec reads its P x P float32 block, so the solver moves ``4 P^2`` bytes per 2 P^2 FLOPs (0.5 FLOP/byte):
  memory-bound unless a chunk's blocks stay in cache across the iterations.
  """
  from engram_jax.ops import cfsr as cfsr_ops  # pylint: disable=import-outside-toplevel
  arrays = [batch.episode_arrays(b.episode, b.docs, b.queries) for b in episodes]
  n_queries = sum(len(b.episode.questions) for b in episodes)
  leg = jax.jit(lambda a: cfsr_ops.cfsr_leg(a, jax.random.key(0), pool=pool, iterations=iterations,
                                            batch_size=batch_size))

  def pool_blocks(a):
    gram = a.docs @ a.docs.T
    def one(q):
      _, idx, valid, g = cfsr_ops.cosine_pool(q, a.docs, a.where, gram, pool=pool)
      return g, (a.docs @ q)[idx], valid
    return jax.lax.map(one, a.queries, batch_size=batch_size)

  pools = jax.jit(pool_blocks)
  solve = jax.jit(lambda g, b, v: cfsr_ops.nnls_ridge_pg(
      g, b, lam=0.005, iterations=iterations, valid=v, power_iterations=power_iterations))
  chunked = jax.jit(lambda g, b, v: jax.lax.map(lambda x: solve(*x), (g, b, v), batch_size=batch_size))
  blocks = [jax.block_until_ready(pools(a)) for a in arrays]
  p_eff = min(pool, arrays[0].docs.shape[0])
  flops = 2.0 * p_eff ** 2 * (iterations + power_iterations) * n_queries
  side = int(round((flops / 2) ** (1 / 3)))
  x = jnp.ones((side, side), jnp.float32)
  gemm = jax.jit(lambda m: m @ m)
  parts = {'leg': [lambda a=a: leg(a) for a in arrays], 'pool': [lambda a=a: pools(a) for a in arrays],
           'solve': [lambda g=g: chunked(*g) for g in blocks], 'gemm': [lambda: gemm(x)]}
  times = {}
  for name, fns in parts.items():
    for f in fns:
      jax.block_until_ready(f())  # compile and warm up
    times[name] = sum(_time_jax(f, repeats)[0] for f in fns)
  return {'n_queries': n_queries, 'pool': p_eff, 'iterations': iterations, 'power_iterations': power_iterations,
          'batch_size': batch_size, 'gflop': flops / 1e9, 'solver_gbytes': 2 * flops / 1e9, 'seconds': times,
          'gemm_gflops': flops / 1e9 / times['gemm']}


def format_cfsr_floor(r: Mapping[str, Any]) -> str:
  t = r['seconds']
  lines = [f"CFS-R on {r['n_queries']} queries: pool P={r['pool']}, {r['power_iterations']} power + "
           f"{r['iterations']} projected-gradient steps, chunks of {r['batch_size']} queries",
           f"solver arithmetic {r['gflop']:.1f} GFLOP, {r['solver_gbytes']:.1f} GB of P x P block reads (float32)",
           '', '| part | seconds | GFLOP/s | GB/s of block reads |', '|---|---|---|---|']
  for name in ('leg', 'pool', 'solve', 'gemm'):
    rate = r['gflop'] / t[name] if name in ('leg', 'solve', 'gemm') else None
    bw = r['solver_gbytes'] / t[name] if name in ('leg', 'solve') else None
    lines.append(f"| {name} | {t[name]:.3f} | {'' if rate is None else f'{rate:.1f}'} | "
                 f"{'' if bw is None else f'{bw:.1f}'} |")
  lines.append(f"\nfloor at this machine's dense-matmul rate: {r['gflop'] / r['gemm_gflops']:.3f} s; the leg is "
               f"{t['leg'] / (r['gflop'] / r['gemm_gflops']):.1f}x that")
  return '\n'.join(lines)


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument('--data', choices=('synthetic', 'locomo'), default='synthetic')
  ap.add_argument('--root', default=None, help='data root for --data locomo')
  ap.add_argument('--cache-dir', default='.cache', help='embedding cache for --data locomo')
  ap.add_argument('--episodes', type=int, default=10, help='synthetic episodes (or the first E of LoCoMo)')
  ap.add_argument('--queries', type=int, default=200, help='synthetic queries per episode')
  ap.add_argument('--repeats', type=int, default=5, help='JAX calls per operator, episode and round (median)')
  ap.add_argument('--rounds', type=int, default=5, help='interleaved rounds (JAX and reference back to back); the '
                                                        'table gives the median and min-max over rounds')
  ap.add_argument('--no-peers', action='store_true', help='skip the BM25 peers (rank_bm25, bm25s)')
  ap.add_argument('--ref-queries', type=int, default=40,
                  help='reference-timed queries per episode (0: all), time scaled to all queries')
  ap.add_argument('--cfsr-batch', type=int, default=None,
                  help='batch_size knob of every operator that has one (the CFS-R family); 0: vmap all queries; '
                       'default: the declarations\' default')
  ap.add_argument('--ops', default=None, help=f'comma-separated operator names and/or {FUSION!r} (default: every '
                                              'registered operator, then rrf)')
  ap.add_argument('--ops-modules', default='', help='comma-separated modules to import first (they register '
                                                    'operators)')
  ap.add_argument('--set', action='append', default=[], metavar='OP.KNOB=VALUE',
                  help='a knob value over the bench defaults (repeatable)')
  ap.add_argument('--cfsr-floor', action='store_true',
                  help='LoCoMo: the CFS-R leg against its arithmetic floor (pool step, solver alone, dense-matmul '
                       'rate)')
  ap.add_argument('--scale', action='store_true',
                  help='the scale table instead: operator cost versus episode size N (one synthetic episode per N)')
  ap.add_argument('--scale-n', default=','.join(str(n) for n in SCALE_NS), help='comma-separated episode sizes N')
  ap.add_argument('--scale-queries', type=int, default=64, help='questions per scale episode (a multiple of 64, '
                                                                'the Q bucket, wastes nothing)')
  ap.add_argument('--scale-ops', default=','.join(SCALE_OPS),
                  help=f'comma-separated operator names and/or {FUSION!r} (RRF of cosine and BM25)')
  ap.add_argument('--dense-budget-gb', type=float, default=1.0,
                  help='skip text operators where dense [N, V] term counts would exceed this')
  ap.add_argument('--check-n', type=int, default=CHECK_N, help='N of the scale-path check (0: none)')
  ap.add_argument('--out', default=None, help='also write the scale table (Markdown) here, and its rows as JSON '
                                              'beside it')
  ap.add_argument('--harness', nargs='*', default=None, metavar='OVERRIDE',
                  help='time the whole evaluation path instead (experiments.evaluate with these Hydra overrides; '
                       'none: the default LoCoMo job), --rounds times; prints the overhead ratio wall / retrieve')
  args = ap.parse_args(argv)
  if args.cfsr_floor:
    print('\n'.join(environment()))
    floor = cfsr_floor(locomo_episodes(args.root, cache_dir=args.cache_dir)[:args.episodes], repeats=args.repeats,
                       batch_size=args.cfsr_batch or 16)
    print(format_cfsr_floor(floor))
    return [floor]
  if args.harness is not None:
    print('\n'.join(environment()))
    rows = harness(args.harness, rounds=max(args.rounds, 2))
    print(format_harness(rows))
    return rows
  for module in filter(None, args.ops_modules.split(',')):
    importlib.import_module(module)
  if args.scale:
    return scale_main(args, ap)
  names = None if args.ops is None else [o for o in args.ops.split(',') if o]
  if names is not None:
    unknown = sorted(set(names) - set(OPERATORS) - {FUSION})
    if unknown:
      ap.error(f'unknown ops {unknown}; choose from {sorted(OPERATORS) + [FUSION]}')
  try:
    overrides = _parse_sets(args.set)
  except ValueError as e:
    ap.error(str(e))
  if set(overrides) - set(OPERATORS):
    ap.error(f'--set names unknown operators {sorted(set(overrides) - set(OPERATORS))}; choose from '
             f'{sorted(OPERATORS)}')
  if args.cfsr_batch is not None:
    for name, op in OPERATORS.items():
      if any(k.name == 'batch_size' for k in op.knobs):
        overrides.setdefault(name, {}).setdefault('batch_size', args.cfsr_batch or None)
  print('\n'.join(environment()))
  if args.data == 'synthetic':
    episodes = synthetic_episodes(n_episodes=args.episodes, n_queries=args.queries)
  else:
    episodes = locomo_episodes(args.root, cache_dir=args.cache_dir)[:args.episodes]
  print(f'{len(episodes)} {args.data} episodes', file=sys.stderr)
  rows = time_operators(episodes, names, repeats=args.repeats, rounds=args.rounds, ref_queries=args.ref_queries,
                        overrides=overrides, peers=not args.no_peers, log=lambda s: print(s, file=sys.stderr))
  print(format_table(rows, n_episodes=len(episodes), n_queries=sum(len(b.episode.questions) for b in episodes)))
  return rows


if __name__ == '__main__':
  main()
