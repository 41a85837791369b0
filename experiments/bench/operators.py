"""Speed: every registered operator's hard leg in JAX (jitted, after warm-up) vs its NumPy reference, timed
interleaved in rounds, plus RRF fusion and BM25 against its peer libraries (rank_bm25, bm25s).

The operators come from the registry (:data:`engram_jax.ops.OPERATORS`): every registered operator is timed
with its declaration's knob defaults, except where :data:`OVERRIDES` pins the locked setups of the published
pages (greedy pool 50, Tide pool 50 / recency 0.1); then the named rows (:data:`ROWS`) and RRF. A benchmark
episode is an :class:`engram_jax.testing.synthetic.EmbeddedEpisode` ``(episode, docs [N, D], queries [Q, D])``
(synthetic, or LoCoMo's with ``--data locomo``), padded by :func:`engram_jax.core.batch.episode_arrays` with its
default buckets, as ``experiments.evaluate`` pads each episode before stacking episodes of similar size into one
group (the bench times one episode per call), so any loader's episodes can be benched.

Rounds: every episode is padded, compiled and warmed up first; then, in each of ``--rounds`` rounds (5), every
episode and operator is timed on the JAX side and the reference side back to back (JAX first in even rounds, the
reference first in odd ones), so that a change in machine load falls on both sides. A round's sample is the time
summed over episodes; the table gives, per side and for the ratio (per round ``reference / JAX``), the median and
(min-max) over rounds, with the XLA / BLAS thread settings under it.

What is timed, per episode and round:

* JAX: the operator's leg ``(EpisodeArrays, key) -> [Q, N]`` over all Q queries of the episode, one jitted call,
  arrays padded to the default buckets (N to a multiple of 128, Q of 64, vocabulary of 1024) so that a
  handful of shapes compile; compile + one warm-up call are excluded; the round's sample is the median of
  ``--repeats`` calls. float32.
  Legs compute what they need inside the call (the CFS-R family its episode Gram, Tide its base scores).
* Reference: the loop-based float64 NumPy code of :mod:`engram_jax.testing.reference`, one query at a time, via
  the adapters of :data:`REFERENCES` (an operator without an adapter is timed on the JAX side only and printed
  with ratio ``n/a``). With ``--ref-queries R`` only the first R queries of each episode are timed and the time is
  scaled by Q / R (the references are per query, so the cost is linear in Q).
* ``rrf``: :func:`engram_jax.ops.rrf.rrf_fuse` (not a leg operator) over the legs of :data:`RRF_STACK` (the CFS-R
  page's stack: cosine, BM25, CFS-R top-50 weighted 3), whose leg scores are computed outside the timer.
* Named rows (:data:`ROWS`, named in ``--ops`` like an operator, changed with ``--set ROW.KNOB=VALUE``): an
  operator at fixed knob values, timed as a row of its own. ``bm25_lucene_exact``: BM25 of the form
  ``'lucene_exact'`` (Lucene's BM25Similarity with exact lengths, every item counted) on Lucene's English analyzer
  (``tokenizer='english'``), k1 0.9, b 0.4 (Anserini's): bm25s's ``method='lucene'`` exactly. Its reference column
  is ``n/a`` (the NumPy reference is Okapi's, :data:`REFERENCE_COVERS`); bm25s is its check.
* Reference tokens: every BM25 reference and peer reads the tokens of its row's analyzer (the ``tokenizer`` knob,
  :data:`engram_jax.core.lexicon.ANALYZERS`), analysed outside the timer, as the JAX leg's term counts are.
* BM25 peers (:data:`ROW_PEERS`, with ``bm25`` or ``bm25_lucene_exact`` in ``--ops``): other libraries' BM25 on all
  queries of the episode, one query at a time, with the row's analyzer tokens (passed pre-tokenised), k1 and b;
  their indexes are built outside the timer; ratio = peer / the row's JAX time. The ``bm25`` row's:
  ``rank_bm25.BM25Okapi.get_scores`` and bm25s ``method='atire', idf_method='robertson'``, the closest of its
  variants to BM25Okapi: equal scores except for terms in more than half the documents (idf 0 there, rank_bm25
  ``epsilon * mean idf``), so its agreement is top-10, not equality (see :func:`_bm25s_peer`). The
  ``bm25_lucene_exact`` row's: bm25s ``method='lucene'`` (equal scores up to float32 rounding). A peer whose form
  is not its row's (``--set bm25.form=lucene``) gets a row that says unavailable, and so does one not importable.
* ``agree``: the fraction of reference-timed queries whose JAX top-10 ids (in order, ties to the later item)
  equal the reference's (the peer's for a peer row, on all queries), from the first round: the same picks for the
  greedy operators; float32 vs float64 (or another library's float32 sums) can flip near-ties.

Run as ``python -m experiments.bench [--data locomo] [--ops ...]`` (:mod:`experiments.bench.cli`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from engram_jax.core import batch
from engram_jax.eval import pipeline
from engram_jax.ops import OPERATORS
from engram_jax.ops import bm25 as bm25_ops
from engram_jax.ops import rrf as rrf_ops
from engram_jax.testing import reference as ref
from engram_jax.testing.synthetic import EmbeddedEpisode
from experiments.bench.common import cell, spread, thread_settings, time_jax

FUSION = 'rrf'  # the fusion row's name in --ops and in the table
# Locked seed setups (the CFS / CFS-R / Tide pages) where they differ from the declarations' defaults.
OVERRIDES: dict[str, dict[str, Any]] = {
  'mmr': {'pool': 50},  # greedy operators: cosine prefilter of 50
  'cfs': {'pool': 50},
  'tide': {'pool': 50, 'recency': 0.1},  # Tide page: base top-50, weight 0.1
}
# The CFS-R page's stack whose legs RRF fuses (a pipeline's legs node).
RRF_STACK: dict[str, dict[str, Any]] = {
  'cos': {'op': 'cosine'},
  'bm25': {'op': 'bm25'},
  'cfsr': {'op': 'cfsr', 'depth': 50, 'weight': 3.0},
}
# Named rows: row name -> an operator (``op``) at fixed knob values, timed as a row of its own with its own peers
# (:data:`ROW_PEERS`); ``--ops`` names it like an operator, ``--set ROW.KNOB=VALUE`` changes a value.
ROWS: dict[str, dict[str, Any]] = {
  # Lucene's BM25 (exact lengths, every item counted) on Lucene's English analyzer, k1 / b Anserini's: bm25s's
  # method='lucene' exactly (the bm25_lucene pipeline is form 'lucene': Lucene's one-byte lengths, which bm25s lacks)
  'bm25_lucene_exact': {'op': 'bm25', 'tokenizer': 'english', 'form': 'lucene_exact', 'k1': 0.9, 'b': 0.4},
}
TOP = 10  # agreement compares the top-10 ids


def row_operator(name: str) -> str:
  """The registered operator a row times: a named row's (:data:`ROWS`) ``op``, else ``name`` itself."""
  return ROWS[name]['op'] if name in ROWS else name


# ----------------------------------------------------------------------------------------------
# References: operator name -> adapter ``(RefEpisode, query index, knob values) -> [N] scores`` over the
# episode's real items (-inf = not ranked); greedy pickers return their picks as leg scores.


class RefEpisode(NamedTuple):
  """One episode as the NumPy references take it (float64, real rows only)."""

  docs: np.ndarray  # [N, D]
  queries: np.ndarray  # [Q, D]
  tokens: Mapping[str, tuple[list[list[str]], list[list[str]]]]  # analyzer -> (N item, Q question token lists)
  positions: np.ndarray  # [N] write order

  @property
  def doc_tokens(self) -> list[list[str]]:
    """The items' ``'words'`` tokens."""
    return self.tokens['words'][0]

  @property
  def query_tokens(self) -> list[list[str]]:
    """The questions' ``'words'`` tokens."""
    return self.tokens['words'][1]


def ref_episode(b: EmbeddedEpisode, analyzers: Sequence[str] = ('words',)) -> RefEpisode:
  """``b`` for the references, its texts analysed by ``'words'`` and each of ``analyzers``
  (:data:`engram_jax.core.lexicon.ANALYZERS`)."""
  tokens = {}
  for name in dict.fromkeys(('words', *analyzers)):
    analyze = bm25_ops.ANALYZERS[name]
    tokens[name] = ([analyze(it.text) for it in b.episode.items], [analyze(q.text) for q in b.episode.questions])
  return RefEpisode(
    docs=np.asarray(b.docs, np.float64),
    queries=np.asarray(b.queries, np.float64),
    tokens=tokens,
    positions=np.arange(b.episode.n_items, dtype=np.float64),
  )


def _bm25_ref(e: RefEpisode, i: int, o: Mapping[str, Any]) -> np.ndarray:
  """rank_bm25's Okapi BM25 on the tokens of the analyzer ``o['tokenizer']``."""
  if o.get('form', 'okapi') != 'okapi':
    raise NotImplementedError(f"the bench's BM25 reference is the okapi form, not {o['form']!r}")
  docs, queries = e.tokens[o.get('tokenizer', 'words')]
  return ref.bm25(queries[i], docs, k1=o['k1'], b=o['b'], epsilon=o['epsilon'])


def _picks(sel: tuple[np.ndarray, np.ndarray], n: int) -> np.ndarray:
  return ref.selection_scores_ref(sel[0], n)


def _tide_ref(e: RefEpisode, i: int, o: Mapping[str, Any]) -> np.ndarray:
  base = (
    ref.cosine_scores_ref(e.queries[i], e.docs)
    if o['base'] == 'cosine'
    else _bm25_ref(e, i, o)  # its k1, b, epsilon, tokenizer and form
  )
  return ref.tide_scores_ref(base, e.positions, weight=o['recency'], depth=o['pool'])


def _mem0_ref(e: RefEpisode, i: int, o: Mapping[str, Any]) -> np.ndarray:
  cos = ref.cosine_scores_ref(e.queries[i], e.docs)
  docs, queries = e.tokens['words']
  bm = ref.bm25(queries[i], docs)
  fused = ref.additive_fuse_ref(cos, bm, max(len(e.query_tokens[i]), 1), threshold=o['threshold'], pool=o['pool'])
  return np.where(np.isneginf(fused), -10.0 + cos, fused)  # the leg's equal-k backfill (engram_jax.ops.controls)


REFERENCES: dict[str, Callable[[RefEpisode, int, Mapping[str, Any]], np.ndarray]] = {
  'cosine': lambda e, i, o: ref.cosine_scores_ref(e.queries[i], e.docs),
  'bm25': _bm25_ref,
  'mmr': lambda e, i, o: _picks(
    ref.mmr_select_ref(e.queries[i], e.docs, k=o['k'], lam=o['lam'], pool=o['pool']), e.docs.shape[0]
  ),
  'cfs': lambda e, i, o: _picks(
    ref.cfs_select_ref(
      e.queries[i], e.docs, k=o['k'], beta=o['beta'], sigma=o['sigma'], floor=o['floor'], pool=o['pool']
    ),
    e.docs.shape[0],
  ),
  'cfsr': lambda e, i, o: ref.cfsr_scores_ref(
    e.queries[i], e.docs, pool=o['pool'], iterations=o['iterations'], lam=o['lam'], w=o['w']
  ),
  'tide': _tide_ref,
  'mem0': _mem0_ref,
}


# The knob values an adapter covers (an operator not listed: all); elsewhere the row is JAX only, reference n/a.
REFERENCE_COVERS: dict[str, Callable[[Mapping[str, Any]], bool]] = {
  'bm25': lambda o: o['form'] == 'okapi',
  'tide': lambda o: o['base'] == 'cosine' or o['form'] == 'okapi',
}


def reference(op: str, options: Mapping[str, Any]) -> Callable[[RefEpisode, int, Mapping[str, Any]], np.ndarray] | None:
  """The reference adapter of operator ``op`` at knob values ``options`` (:data:`REFERENCES`), or None where
  there is none or it does not cover them (:data:`REFERENCE_COVERS`)."""
  adapter = REFERENCES.get(op)
  covers = REFERENCE_COVERS.get(op)
  return adapter if adapter is not None and (covers is None or covers(options)) else None


def top_ids(scores: np.ndarray, k: int = TOP) -> list[int]:
  """The top-``k`` ids of the finite entries of ``scores [N]`` (ties to the later item)."""
  scores = np.asarray(scores, np.float64)
  return ref.order_later_wins(scores, np.flatnonzero(np.isfinite(scores)).tolist())[:k]


# ----------------------------------------------------------------------------------------------
# BM25 peers: other BM25 implementations timed on the same queries and tokens as a JAX BM25 row (ROW_PEERS).


class Peer(NamedTuple):
  """A BM25 peer: ``build(doc_tokens, k1, b, epsilon) -> score(query_tokens) -> [N]`` (the index is built outside
  the timer), or None with ``why`` when the library is not importable. ``form``: the BM25 form (of
  :data:`engram_jax.ops.bm25.FORMS`) it computes (a row of another form gets it as unavailable); ``note``: printed
  under the table, formatted with the peer's row (``{high_df_queries}``, ``{queries}``)."""

  name: str
  build: Callable[[list[list[str]], float, float, float], Callable[[list[str]], np.ndarray]] | None
  why: str = ''
  form: str = 'okapi'
  note: str = ''


def _rank_bm25_peer() -> Peer:
  name = 'bm25 (rank_bm25)'
  try:
    import rank_bm25
  except ImportError as e:
    return Peer(name, None, f'rank_bm25 not importable ({e})')

  def build(docs, k1, b, epsilon):
    return rank_bm25.BM25Okapi(docs, k1=k1, b=b, epsilon=epsilon).get_scores

  return Peer(name, build, note='rank_bm25 BM25Okapi.get_scores per query: the okapi form the JAX leg reproduces.')


def _bm25s_peer(name: str = 'bm25 (bm25s)', method: str = 'atire') -> Peer:
  """bm25s: a sparse (CSC) matrix of precomputed per-(term, doc) scores; a query sums its terms' columns.

  ``method='atire'`` (term part ``tf (k1 + 1) / (tf + k1 (1 - b + b |d| / avgdl))``, as Okapi) with
  ``idf_method='robertson'`` (``log((n - df + 0.5) / (df + 0.5))``) is the closest of its variants to
  ``BM25Okapi``: equal scores, except that a term in more than half the documents gets idf 0 where rank_bm25
  gives it ``epsilon * mean idf``. (``method='robertson'`` also drops the constant ``k1 + 1``.)
  ``method='lucene'`` (its default idf, ``log(1 + (n - df + 0.5) / (df + 0.5))``; term part
  ``tf / (tf + k1 (1 - b + b |d| / avgdl))``, exact lengths, every document counted) is the JAX form
  ``'lucene_exact'``: equal scores up to float32 rounding. Timed path: ``get_scores(tokens)`` per query (the full
  ``[N]`` scores, like the other rows; its batched ``retrieve`` adds top-k selection and a thread pool, and is
  slower on these small episodes).
  """
  if method == 'atire':
    kw, form = {'method': 'atire', 'idf_method': 'robertson'}, 'okapi'
    note = (
      'bm25s method=atire, idf_method=robertson, get_scores per query; it floors the idf of terms in more than half '
      "the documents at 0 (rank_bm25: epsilon x mean idf), so its scores equal rank_bm25's only on queries without "
      'such terms; {high_df_queries}/{queries} queries here have one.'
    )
  elif method == 'lucene':
    kw, form = {'method': 'lucene'}, 'lucene_exact'
    note = (
      'bm25s method=lucene, get_scores per query: idf log(1 + (n - df + 0.5) / (df + 0.5)), '
      'tf / (tf + k1 (1 - b + b |d| / avgdl)), exact lengths: the JAX form lucene_exact, the same scores up to '
      'float32 rounding (top-10 differ only at near-ties).'
    )
  else:
    raise ValueError(f"bench: bm25s peer method {method!r}; known: 'atire', 'lucene'")
  try:
    import bm25s
  except ImportError as e:
    return Peer(name, None, f'bm25s not installed ({e}); pip install "engram_jax[bench]"', form)

  def build(docs, k1, b, epsilon):
    del epsilon  # bm25s floors negative idf at 0 (atire / robertson); no epsilon in Lucene's idf
    index = bm25s.BM25(k1=k1, b=b, **kw)
    index.index(docs, show_progress=False)
    zeros = np.zeros(len(docs), np.float32)
    return lambda q: index.get_scores(q) if q else zeros

  return Peer(name, build, form=form, note=note)


PEERS: dict[str, Callable[[], Peer]] = {'rank_bm25': _rank_bm25_peer, 'bm25s': _bm25s_peer}  # the bm25 row's
# Each JAX BM25 row's peers (timed when the row is in --ops): the bm25 row's, and bm25s's Lucene method for the
# named row of the same form and analyzer.
ROW_PEERS: dict[str, dict[str, Callable[[], Peer]]] = {
  'bm25': PEERS,
  'bm25_lucene_exact': {'bm25s': lambda: _bm25s_peer('bm25_lucene_exact (bm25s)', method='lucene')},
}


def available_peers(row: str = 'bm25') -> list[Peer]:
  """The peers of JAX row ``row`` (:data:`ROW_PEERS`; none for a row without any)."""
  return [make() for make in ROW_PEERS.get(row, {}).values()]


# ----------------------------------------------------------------------------------------------
# The benchmark.


def _time_ref(fn: Callable[[int], np.ndarray], n_queries: int) -> tuple[float, list[np.ndarray]]:
  """Seconds of one pass of ``fn`` over queries ``0 .. n_queries - 1``, and the outputs."""
  t = time.perf_counter()
  out = [fn(i) for i in range(n_queries)]
  return time.perf_counter() - t, out


def operator_options(name: str, overrides: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
  """The knob values the bench times operator (or named row, :data:`ROWS`) ``name`` with: the operator's defaults,
  then :data:`OVERRIDES`, then the named row's values, then ``overrides[name]`` (validated by the declaration)."""
  op = row_operator(name)
  row = {k: v for k, v in ROWS.get(name, {}).items() if k != 'op'}
  given = {**OVERRIDES.get(op, {}), **row, **(overrides or {}).get(name, {})}
  return OPERATORS[op].options(given, where=f'bench {name}')


POWER_ITERATIONS = 20  # the CFS-R solve's power iterations (engram_jax.ops.nnls.nnls_ridge_pg's default)


def solve_cost(options: Mapping[str, Any], n_items: int, n_queries: int) -> tuple[float, float] | None:
  """``(FLOPs, bytes)`` of the CFS-R solve in an operator with ``pool`` and ``iterations`` knobs (the CFS-R family),
  else None: per query ``power + iterations`` matvecs on its ``P x P`` float32 pool Gram, ``P = min(pool, N)``:
  ``2 P^2`` FLOPs and ``4 P^2`` bytes of block reads each (0.5 FLOP/byte: memory-bound unless a chunk's blocks stay
  in cache across the iterations). The pool gather, blend and scatter are O(P^2) once and O(P) per query."""
  if 'pool' not in options or 'iterations' not in options:
    return None
  p = min(int(options['pool']), n_items)
  steps = int(options['iterations']) + POWER_ITERATIONS
  return 2.0 * p * p * steps * n_queries, 4.0 * p * p * steps * n_queries


def _row(name: str, options: Mapping[str, Any], has_ref: bool, rounds: int) -> dict[str, Any]:
  return {
    'gflop': None,
    'gbytes': None,
    'op': name,
    'options': dict(options),
    'jax_s': 0.0,
    'ref_s': 0.0 if has_ref else None,
    'agree': 0,
    'checked': 0,
    'ratio': None,
    'episodes': 0,
    'queries': 0,
    'peer_of': None,
    'unavailable': None,
    'jax_rounds': [0.0] * rounds,
    'ref_rounds': [0.0] * rounds if has_ref else None,
    'ratio_rounds': None,
    'devices': 1,
    'all_rounds': None,
    'all_s': None,
    'ratio_all': None,
    'ratio_all_rounds': None,
  }


def time_operators(
  episodes: Sequence[EmbeddedEpisode],
  names: Sequence[str] | None = None,
  *,
  repeats: int = 5,
  rounds: int = 5,
  ref_queries: int = 40,
  overrides: Mapping[str, Mapping[str, Any]] | None = None,
  peers: bool = True,
  seed: int = 0,
  log: Callable[[str], None] | None = None,
  devices: Sequence[Any] | None = None,
) -> list[dict[str, Any]]:
  """Time operators (registered names, named rows of :data:`ROWS`, or :data:`FUSION` for RRF) on every episode; one
  row per name, then the BM25 peer rows.

  The two sides are interleaved: all episodes are prepared (padded, compiled, warmed up) first; then, in each of
  ``rounds`` rounds, every episode and operator is timed on the JAX side and on the reference side back to back,
  JAX first in even rounds and the reference first in odd ones (so a drift in machine load hits both). A round's
  time is the sum over episodes; each row reports the median over rounds, and the per-round samples.

  Args:
    episodes: the benchmark episodes.
    names: registered operator names, named rows and/or ``'rrf'``; None = every registered operator, the named
      rows, then ``'rrf'``.
    repeats: JAX calls per operator, episode and round (their median is the round's JAX sample).
    rounds: interleaved rounds (samples per side).
    ref_queries: reference-timed queries per episode (0 = all); the time is scaled to all queries.
    overrides: ``{operator or named row: {knob: value}}`` over the bench's knob values (:func:`operator_options`).
    peers: for each row of :data:`ROW_PEERS` in ``names`` (``'bm25'``: rank_bm25, bm25s; ``'bm25_lucene_exact'``:
      bm25s's Lucene method), also time its peers on all queries of every episode, with the row's k1 / b / epsilon
      and its analyzer's tokens; a peer that is not importable, or computes another form than the row's, gets a
      row with ``unavailable`` set and no times.
    seed: the PRNG key of the legs (only stochastic legs such as cos2 read it).
    log: called with one progress line per episode and per round.
    devices: with more than one (one CPU device per core), each round also times every episode's call at once (all
      calls dispatched, then awaited), each episode on one device, the episodes dealt to the devices by question
      count (largest first, to the least loaded): the machine's cores at work as evaluation puts them to work
      (:func:`engram_jax.eval.sharding.split_run`). Its outputs equal the one-device outputs bit for bit (checked).

  Returns:
    One dict per name, in order, then one per peer: ``op``, ``options`` (knob values), ``jax_s`` (median over
    rounds of the time summed over episodes), ``ref_s`` (the same for the reference, scaled to all queries, or the
    peer; None without one), ``ratio`` (median over rounds of ``ref / jax``, or None), ``jax_rounds`` /
    ``ref_rounds`` / ``ratio_rounds`` (the per-round samples), ``agree`` / ``checked`` (queries whose top-10 ids
    agree / queries compared, first round), ``episodes``, ``queries``, ``peer_of`` (for a peer row, the JAX row
    whose time it is compared with), ``unavailable`` (why a peer was not timed).

  Raises:
    ValueError: an unknown operator name (listing the registered ones) or an invalid knob value.
  """
  if names is None:  # every operator that runs on its defaults (trec_run reads a run file: named with --set only)
    names = [*(n for n, op in OPERATORS.items() if op.check_options is None), *ROWS, FUSION]
  names = list(names)
  unknown = [n for n in names if n not in OPERATORS and n not in ROWS and n != FUSION]
  if unknown:
    raise ValueError(
      f'unknown operators {unknown}; registered: {sorted(OPERATORS)} (and the named rows {list(ROWS)}, '
      f'{FUSION!r}, the fusion)'
    )
  unknown = sorted(set(overrides or {}) - set(OPERATORS) - set(ROWS))
  if unknown:
    raise ValueError(
      f'knob overrides for unknown operators {unknown}; registered: {sorted(OPERATORS)}, named rows: {list(ROWS)}'
    )
  rounds = max(int(rounds), 1)
  key = jax.random.key(seed)
  legs = {
    n: pipeline.make_pipeline(name=n, legs={n: {'op': row_operator(n), **operator_options(n, overrides)}}).legs[0]
    for n in names
    if n != FUSION
  }
  adapters = {n: reference(leg.op, dict(leg.options)) for n, leg in legs.items()}
  stack = pipeline.make_pipeline(name=FUSION, fusion='rrf', legs=RRF_STACK) if FUSION in names else None
  built = pipeline.build_options(
    [pipeline.Pipeline(legs=(leg,)) for leg in legs.values()] + ([stack] if stack is not None else [])
  )
  fns = {n: jax.jit(leg.score) for n, leg in legs.items()}
  rows = {
    n: _row(n, legs[n].options if n in legs else {}, n == FUSION or adapters[n] is not None, rounds) for n in names
  }
  if stack is not None:
    stack_fns = [jax.jit(leg.score) for leg in stack.legs]
    weights = jnp.asarray([leg.weight for leg in stack.legs])
    depths = [leg.depth for leg in stack.legs]
    fuse = jax.jit(lambda s, where: rrf_ops.rrf_fuse(s, weights=weights, depths=depths, where=where, k0=stack.k0))
    rows[FUSION]['options'] = {
      'legs': {leg.name: leg.op for leg in stack.legs},
      'weights': weights.tolist(),
      'depths': depths,
      'k0': stack.k0,
    }
  peer_list = [(of, p) for of in legs for p in available_peers(of)] if peers else []  # (JAX row, peer)
  peer_rows = {}
  for of, p in peer_list:
    o = dict(legs[of].options)
    why = p.why if p.build is None else ''
    if not why and o['form'] != p.form:
      why = f"it computes BM25's {p.form!r} form; the {of} row runs {o['form']!r}"
    row = _row(p.name, {k: o[k] for k in ('k1', 'b', 'epsilon', 'tokenizer')}, not why, rounds)
    row['peer_of'] = of
    row['jax_rounds'] = None
    row['high_df_queries'] = 0  # queries with a term in more than half the documents (bm25s's idf differs there)
    row['note'] = p.note
    row['unavailable'] = why or None
    if p.name in peer_rows or p.name in rows:
      raise ValueError(f'bench: two rows named {p.name!r}')
    peer_rows[p.name] = row
  analyzers = [o['tokenizer'] for o in (dict(leg.options) for leg in legs.values()) if 'tokenizer' in o]

  devices = list(devices) if devices is not None and len(devices) > 1 else []
  home = deal_episodes([len(b.episode.questions) for b in episodes], len(devices)) if devices else []
  spread_thunks: dict[str, list[Callable[[], Any]]] = {n: [] for n in names}

  # Preparation: pad, compile and warm up every (episode, operator); build the peers' indexes.
  prepared = []  # per episode: (q, r_q, {name: (jax thunk, reference fn or None)}, {peer: score fn})
  for e_i, b in enumerate(episodes):
    arr = batch.episode_arrays(b.episode, b.docs, b.queries, **built)
    n, q = b.episode.n_items, len(b.episode.questions)
    r_q = q if ref_queries <= 0 else min(q, ref_queries)
    e_ref = ref_episode(b, analyzers)
    timed = {}
    for name in names:
      if name == FUSION:
        stacked = jnp.stack([f(arr, key) for f in stack_fns])  # outside the timer
        s64 = np.asarray(stacked, np.float64)[:, :q, :n]
        thunk = (lambda st, w: lambda: fuse(st, w))(stacked, arr.where)
        fn_ref = (lambda s: lambda i: ref.rrf_fuse_ref(s[:, i], [l.weight for l in stack.legs], depths, k0=stack.k0))(
          s64
        )
      else:
        thunk = (lambda f, a: lambda: f(a, key))(fns[name], arr)
        adapter = adapters[name]
        opts = dict(legs[name].options)
        fn_ref = None if adapter is None else (lambda ad, ee, o: lambda i: ad(ee, i, o))(adapter, e_ref, opts)
      first = jax.block_until_ready(thunk())  # compile + warm-up
      timed[name] = (thunk, fn_ref)
      if devices:
        dev = devices[home[e_i]]
        if name == FUSION:
          there = jax.device_put((stacked, arr.where), dev)
          on_dev = (lambda st_w: lambda: fuse(*st_w))(there)
        else:
          on_dev = (lambda f, a: lambda: f(a, key))(fns[name], jax.device_put(arr, dev))
        # compile and warm up on its device: the same bits as on one device, or no timing
        if not np.array_equal(np.asarray(jax.block_until_ready(on_dev())), np.asarray(first)):
          raise RuntimeError(f'bench: {name} on several devices differs from its one-device output')
        spread_thunks[name].append(on_dev)
      cost = solve_cost(rows[name]['options'], n, q) if name != FUSION else None
      if cost is not None:
        rows[name]['gflop'] = (rows[name]['gflop'] or 0.0) + cost[0] / 1e9
        rows[name]['gbytes'] = (rows[name]['gbytes'] or 0.0) + cost[1] / 1e9
      rows[name]['episodes'] += 1
      rows[name]['queries'] += q
    scorers: dict[str, dict[str, Callable[[int], np.ndarray]]] = {}  # JAX row -> {peer: score fn}
    high_df = {}  # analyzer -> queries with a term in more than half the documents
    for of, p in peer_list:
      row = peer_rows[p.name]
      o = row['options']
      doc_toks, query_toks = e_ref.tokens[o['tokenizer']]
      if o['tokenizer'] not in high_df:
        df: dict[str, int] = {}
        for d in doc_toks:
          for t in set(d):
            df[t] = df.get(t, 0) + 1
        high_df[o['tokenizer']] = sum(any(2 * df.get(t, 0) > n for t in toks) for toks in query_toks)
      row['episodes'] += 1
      row['queries'] += q
      row['high_df_queries'] += high_df[o['tokenizer']]
      if row['ref_rounds'] is not None:
        score = p.build(doc_toks, o['k1'], o['b'], o['epsilon'])  # the index, outside the timer
        scorers.setdefault(of, {})[p.name] = (lambda s, toks: lambda i: s(toks[i]))(score, query_toks)
    prepared.append((n, q, r_q, timed, scorers))
    if log is not None:
      log(
        f'episode {e_i + 1}/{len(episodes)}: N={n} (padded {arr.docs.shape[0]}), Q={q} (padded '
        f'{arr.queries.shape[0]}), reference on {r_q} queries'
      )

  if devices:
    for name in names:
      rows[name]['devices'] = len(devices)
      rows[name]['all_rounds'] = [0.0] * rounds

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
        jax_s, out = time_jax(thunk, repeats)
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
        for p_name, fn_peer in scorers.get(name, {}).items():
          p_s, p_out = _time_ref(fn_peer, q)
          peer_rows[p_name]['ref_rounds'][r] += p_s
          if r == 0:
            peer_rows[p_name]['agree'] += sum(top_ids(got[i]) == top_ids(p_out[i]) for i in range(q))
            peer_rows[p_name]['checked'] += q
    if devices:  # every episode at once, over the devices
      for name in names:
        rows[name]['all_rounds'][r] = time_jax(lambda ts=spread_thunks[name]: [t() for t in ts], repeats)[0]
    if log is not None:
      log(f'round {r + 1}/{rounds} ({"JAX" if jax_first else "reference"} first)')

  for row in rows.values():
    row['jax_s'] = spread(row['jax_rounds'])['median']
    if row['ref_rounds'] is not None:
      row['ref_s'] = spread(row['ref_rounds'])['median']
      if all(t > 0 for t in row['jax_rounds']):
        row['ratio_rounds'] = [a / t for a, t in zip(row['ref_rounds'], row['jax_rounds'])]
        row['ratio'] = spread(row['ratio_rounds'])['median']
    if row['all_rounds'] is not None:
      row['all_s'] = spread(row['all_rounds'])['median']
      if row['ref_rounds'] is not None and all(t > 0 for t in row['all_rounds']):
        row['ratio_all_rounds'] = [a / t for a, t in zip(row['ref_rounds'], row['all_rounds'])]
        row['ratio_all'] = spread(row['ratio_all_rounds'])['median']
  for row in peer_rows.values():
    base = rows[row['peer_of']]
    row['jax_s'] = base['jax_s']
    row['jax_rounds'] = list(base['jax_rounds'])
    if row['ref_rounds'] is not None:
      row['ref_s'] = spread(row['ref_rounds'])['median']
      if all(t > 0 for t in row['jax_rounds']):
        row['ratio_rounds'] = [a / t for a, t in zip(row['ref_rounds'], row['jax_rounds'])]
        row['ratio'] = spread(row['ratio_rounds'])['median']
  return [rows[n] for n in names] + list(peer_rows.values())


def deal_episodes(sizes: Sequence[int], n_devices: int) -> list[int]:
  """Each episode's device: largest first (by ``sizes``, e.g. question counts) to the least loaded device.

  >>> deal_episodes([10, 40, 30, 20], 2)
  [0, 0, 1, 1]
  """
  load = [0] * n_devices
  home = [0] * len(sizes)
  for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
    home[i] = min(range(n_devices), key=lambda d: (load[d], d))
    load[home[i]] += sizes[i]
  return home


def format_table(
  rows: Sequence[Mapping[str, Any]], *, n_episodes: int, n_queries: int, threads: str | None = None
) -> str:
  """Markdown: one line per row, median over rounds with (min-max); ``n/a`` where an operator has no reference.
  A peer row (``peer_of`` set) compares the JAX row it names with the peer library; ``threads``
  (:func:`thread_settings` by default) is printed under the table."""
  n_rounds = max((len(r['jax_rounds'] or []) for r in rows), default=0)
  n_dev = max((r.get('devices', 1) for r in rows), default=1)
  spread_cols = n_dev > 1
  head = f' JAX ms, {n_dev} devices | ratio, {n_dev} devices |' if spread_cols else ''
  lines = [
    f'{n_episodes} episodes, {n_queries} queries, {n_rounds} interleaved rounds; times are totals over all '
    'queries, median (min-max) over rounds (JAX float32 jitted; NumPy float64 reference, or the peer library)'
    + (
      f'; "JAX ms" is one device (one core), episode after episode; "{n_dev} devices": every episode at once, '
      'each on one device (one per core), as evaluation runs them'
      if spread_cols
      else ''
    ),
    f'| op | JAX ms | reference / peer ms | ratio |{head} agree | solve work: GFLOP, GB block reads -> GFLOP/s |',
    '|---|---:|---:|---:|' + ('---:|---:|' if spread_cols else '') + '---:|---:|',
  ]
  for r in rows:
    work = ''
    if r.get('gflop') and r.get('jax_s'):
      work = f'{r["gflop"]:.2f}, {r["gbytes"]:.2f} -> {r["gflop"] / r["jax_s"]:.1f}'
    if r.get('gflop') and r.get('all_s'):
      work += f' ({r["gflop"] / r["all_s"]:.1f} on {n_dev} devices)'
    extra = ''
    if spread_cols:
      extra = (
        f' {cell(r.get("all_rounds"))} | {cell(r.get("ratio_all_rounds"), 1.0, "{:.1f}", "x")} |'
        if not r.get('peer_of')
        else ' | |'
      )
    if r.get('unavailable'):
      lines.append(f'| {r["op"]} | {cell(r["jax_rounds"])} | unavailable | n/a |{extra} n/a | |')
      continue
    has = r['ref_s'] is not None
    agree = f'{r["agree"]}/{r["checked"]}' if has else 'n/a'
    jax_cell = cell(r['jax_rounds']) if r['jax_rounds'] is not None else 'n/a'
    if r.get('peer_of'):
      jax_cell = f'({r["peer_of"]}) {jax_cell}'
    lines.append(
      f'| {r["op"]} | {jax_cell} | {cell(r["ref_rounds"])} | {cell(r["ratio_rounds"], 1.0, "{:.1f}", "x")} |{extra} '
      f'{agree} | {work} |'
    )
  notes = [f'- {r["op"]}: unavailable: {r["unavailable"]}' for r in rows if r.get('unavailable')]
  for r in rows:
    if r['op'] in ROWS and not r.get('peer_of'):
      fixed = ', '.join(f'{k}={v}' for k, v in ROWS[r['op']].items() if k != 'op')
      notes.append(f'- {r["op"]}: {ROWS[r["op"]]["op"]} with {fixed}')
  peer_rows = [r for r in rows if r.get('peer_of')]
  if peer_rows:
    notes.append(
      '- peer rows: ratio = peer time / the JAX time of the row in parentheses, on the same queries (all of them) '
      "and the row's analyzer tokens, the peer's index built outside the timer; agree = JAX top-10 ids equal to "
      "the peer's."
    )
    notes += [f'- {r["op"]}: {r["note"].format(**r)}' for r in peer_rows if r.get('note') and not r.get('unavailable')]
  if any(r.get('gflop') for r in rows):
    notes.append(
      '- solve work (the CFS-R family): per real question, 20 power + `iterations` projected-gradient matvecs on the '
      'P x P float32 pool Gram, 2 P^2 FLOPs and 4 P^2 bytes each (0.5 FLOP/byte); GFLOP/s = that work / the JAX '
      "median (the whole leg's time, pool gather included). `--cfsr-floor` splits the leg into its parts."
    )
  lines += notes + [threads if threads is not None else thread_settings()]
  return '\n'.join(lines)
