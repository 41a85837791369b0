"""Speed: each operator in JAX (jitted, after warm-up, median of repeats) vs its NumPy reference.

    python -m experiments.bench                       # 10 synthetic LoCoMo-sized episodes
    python -m experiments.bench --data locomo         # the real LoCoMo episodes (MiniLM, cached)
    python -m experiments.bench --ref-queries 0       # time the references on every query (slow)

An episode is a tuple ``(docs [N, D], queries [Q, D], doc_tokens, query_tokens)``;
:func:`bench_episodes` takes a list of them, so any dataset can be plugged in.

What is timed, per episode (times are summed over episodes):

* JAX: one jitted call over all Q queries of the episode, arrays padded to buckets (N to a multiple
  of 128, Q to a multiple of 32, vocabulary to a multiple of 512) so that a handful of shapes
  compile; compile + one warm-up call are excluded, the median of ``--repeats`` calls is reported.
  float32 (JAX's default). CFS-R includes the episode Gram ``docs @ docs.T`` in its timed call.
* Reference: the loop-based float64 NumPy operators of ``tests/reference_ops.py``, one query at a
  time; BM25's reference is ``rank_bm25.BM25Okapi.get_scores`` (the index is built outside the
  timer). With ``--ref-queries R`` only the first R queries of each episode are timed and the time is
  scaled by Q / R (the references are per query, so the cost is linear in Q).
* ``agree``: the fraction of reference-timed queries whose JAX result matches the reference (same
  top-10 ids for score operators, same picks for greedy ones; float32 vs float64 can flip near-ties).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import sys
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from engram_jax import diversity, fusion, lexical, reconstruction, recency, similarity
from tests import reference_ops as ref

Episode = tuple[np.ndarray, np.ndarray, Sequence[Sequence[str]], Sequence[Sequence[str]]]


@dataclasses.dataclass(frozen=True)
class BenchConfig:
  """Operator settings (the locked setups of the CFS / CFS-R / Tide pages) and timing options."""

  k: int = 10                  # greedy picks (MMR, CFS)
  mmr_lam: float = 0.5
  cfs_beta: float = 0.20
  cfs_sigma: float = 0.40
  greedy_pool: int = 50        # cosine prefilter of the greedy ops
  cfsr_pool: int = 150
  cfsr_iterations: int = 80
  cfsr_lam: float = 0.005
  cfsr_w: float = 0.90
  cfsr_batch: int | None = 16  # queries per lax.map chunk (None: vmap all at once)
  tide_depth: int = 50
  tide_weight: float = 0.1
  rrf_weights: tuple[float, ...] = (1.0, 1.0, 3.0)  # cosine, BM25, CFS-R (the CFS-R page's stack)
  rrf_depths: tuple[int, ...] = (10, 10, 50)
  repeats: int = 5
  ref_queries: int = 40        # 0: all
  n_bucket: int = 128
  q_bucket: int = 32
  v_bucket: int = 512


OPS = ('cosine', 'bm25', 'rrf', 'mmr', 'cfs', 'cfsr', 'tide')


# ----------------------------------------------------------------------------------------------
# Episodes.


def synthetic_episodes(*, n_episodes: int = 10, n_queries: int = 200, dim: int = 384, seed: int = 0,
                       vocab: int = 3000) -> list[Episode]:
  """LoCoMo-sized random episodes: N in 370..690 items, ``n_queries`` questions, D = 384.

  Items are unit vectors with a shared mean direction (cosines around 0.2, like sentence embeddings);
  each query is a noisy copy of a random item. Tokens are Zipf-distributed words; a query borrows half
  of its tokens from its source item.
  """
  rng = np.random.default_rng(seed)
  words = [f'w{i}' for i in range(vocab)]
  zipf = 1.0 / np.arange(1, vocab + 1)
  zipf /= zipf.sum()
  mean = rng.normal(size=dim)
  mean /= np.linalg.norm(mean)
  episodes = []
  for _ in range(n_episodes):
    n = int(rng.integers(370, 691))
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
    episodes.append((docs.astype(np.float32), queries.astype(np.float32), doc_tokens, query_tokens))
  return episodes


def locomo_episodes(root: str | None = None, *, cache_dir: str = '.cache',
                    model_id: str | None = None) -> list[Episode]:
  """The real LoCoMo episodes: item / question texts embedded (through the cache) and tokenised."""
  from engram_jax import embed
  from engram_jax.data.locomo import load_locomo

  episodes, _ = load_locomo(root)
  kw = {} if model_id is None else {'model_id': model_id}
  out = []
  for ep in episodes:
    items = [it.text for it in ep.items]
    questions = [q.text for q in ep.questions]
    vecs = embed.embed_texts(items + questions, cache_dir=cache_dir, **kw)
    out.append((vecs[:len(items)], vecs[len(items):], [lexical.tokenize(t) for t in items],
                [lexical.tokenize(t) for t in questions]))
  return out


# ----------------------------------------------------------------------------------------------
# JAX side: one jitted function per operator over a padded episode.


def _ceil(x: int, m: int) -> int:
  return max(m, -(-x // m) * m)


@dataclasses.dataclass
class Padded:
  docs: np.ndarray        # [Np, D] float32
  queries: np.ndarray     # [Qp, D]
  where: np.ndarray       # [Np] bool
  positions: np.ndarray   # [Np] float32
  doc_tf: np.ndarray      # [Np, Vp]
  query_tf: np.ndarray    # [Qp, Vp]
  n: int
  q: int


def pad_episode(ep: Episode, cfg: BenchConfig) -> Padded:
  docs, queries, doc_tokens, query_tokens = ep
  n, d = docs.shape
  q = queries.shape[0]
  n_p, q_p = _ceil(n, cfg.n_bucket), _ceil(q, cfg.q_bucket)
  vocab = lexical.build_vocab(doc_tokens)
  v_p = _ceil(len(vocab), cfg.v_bucket)
  dp = np.zeros((n_p, d), np.float32)
  dp[:n] = docs
  qp = np.repeat(queries[:1], q_p, axis=0).astype(np.float32)  # padding queries copy the first one
  qp[:q] = queries
  q_tokens = list(query_tokens) + [query_tokens[0]] * (q_p - q)
  return Padded(docs=dp, queries=qp, where=np.arange(n_p) < n,
                positions=np.arange(n_p, dtype=np.float32),
                doc_tf=lexical.term_counts(doc_tokens, vocab, n_rows=n_p, n_cols=v_p),
                query_tf=lexical.term_counts(q_tokens, vocab, n_rows=q_p, n_cols=v_p), n=n, q=q)


def jax_ops(cfg: BenchConfig) -> dict[str, Callable[..., jax.Array]]:
  """Jitted operators ``(padded arrays..., legs) -> output``; hyperparameters are bound as constants."""

  def cosine(p):
    return similarity.cosine_scores(p['queries'], p['docs'], where=p['where'])

  def bm25(p):
    return lexical.bm25_scores(p['query_tf'], p['doc_tf'], where=p['where'])

  def rrf(p):
    return fusion.rrf_fuse(p['legs'], weights=jnp.asarray(cfg.rrf_weights), depths=cfg.rrf_depths,
                           where=p['where'])

  def mmr(p):
    return diversity.mmr_select(p['queries'], p['docs'], k=cfg.k, lam=cfg.mmr_lam, where=p['where'],
                                pool=cfg.greedy_pool).indices

  def cfs(p):
    return diversity.cfs_select(p['queries'], p['docs'], k=cfg.k, beta=cfg.cfs_beta, sigma=cfg.cfs_sigma,
                                where=p['where'], pool=cfg.greedy_pool).indices

  def cfsr(p):
    gram = p['docs'] @ p['docs'].T
    return reconstruction.cfsr_scores(p['queries'], p['docs'], where=p['where'], gram=gram,
                                      pool=cfg.cfsr_pool, iterations=cfg.cfsr_iterations, lam=cfg.cfsr_lam,
                                      w=cfg.cfsr_w, batch_size=cfg.cfsr_batch)

  def tide(p):
    return recency.tide_scores(p['base'], p['positions'], weight=cfg.tide_weight, depth=cfg.tide_depth,
                               where=p['where'])

  fns = dict(cosine=cosine, bm25=bm25, rrf=rrf, mmr=mmr, cfs=cfs, cfsr=cfsr, tide=tide)
  return {name: jax.jit(fn) for name, fn in fns.items()}


# ----------------------------------------------------------------------------------------------
# Reference side: one query at a time.


def ref_ops(cfg: BenchConfig) -> dict[str, Callable[..., np.ndarray]]:
  """Per-query references ``(episode inputs, query index) -> output``."""
  return dict(
      cosine=lambda e, i: ref.cosine_scores_ref(e['queries'][i], e['docs']),
      bm25=lambda e, i: e['bm25_index'].get_scores(e['query_tokens'][i]),
      rrf=lambda e, i: ref.rrf_fuse_ref(e['legs'][:, i], cfg.rrf_weights, cfg.rrf_depths),
      mmr=lambda e, i: ref.mmr_select_ref(e['queries'][i], e['docs'], k=cfg.k, lam=cfg.mmr_lam,
                                          pool=cfg.greedy_pool)[0],
      cfs=lambda e, i: ref.cfs_select_ref(e['queries'][i], e['docs'], k=cfg.k, beta=cfg.cfs_beta,
                                          sigma=cfg.cfs_sigma, pool=cfg.greedy_pool)[0],
      cfsr=lambda e, i: ref.cfsr_scores_ref(e['queries'][i], e['docs'], pool=cfg.cfsr_pool,
                                            iterations=cfg.cfsr_iterations, lam=cfg.cfsr_lam, w=cfg.cfsr_w),
      tide=lambda e, i: ref.tide_scores_ref(e['base'][i], e['positions'], weight=cfg.tide_weight,
                                            depth=cfg.tide_depth),
  )


def _top_ids(scores: np.ndarray, k: int = 10) -> list[int]:
  fin = [i for i in range(len(scores)) if np.isfinite(scores[i])]
  return ref.order_later_wins(scores, fin)[:k]


def _agrees(op: str, got: np.ndarray, want: np.ndarray) -> bool:
  if op in ('mmr', 'cfs'):
    return np.array_equal(np.asarray(got), np.asarray(want))
  return _top_ids(np.asarray(got, np.float64)) == _top_ids(np.asarray(want, np.float64))


# ----------------------------------------------------------------------------------------------
# The benchmark.


@dataclasses.dataclass
class Row:
  op: str
  jax_s: float = 0.0
  ref_s: float = 0.0
  agree: int = 0
  checked: int = 0

  @property
  def ratio(self) -> float:
    return self.ref_s / self.jax_s if self.jax_s > 0 else float('nan')


def _median_time(fn: Callable[[], object], repeats: int) -> float:
  jax.block_until_ready(fn())  # warm-up (compiles on the first shape)
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t)
  return float(np.median(times))


def bench_episodes(episodes: Sequence[Episode], cfg: BenchConfig = BenchConfig(), *,
                   ops: Sequence[str] = OPS, log: Callable[[str], None] = print) -> list[Row]:
  """Times every operator on every episode; returns one :class:`Row` per operator (sums)."""
  from rank_bm25 import BM25Okapi

  jfns, rfns = jax_ops(cfg), ref_ops(cfg)
  rows = {op: Row(op) for op in ops}
  for e_i, ep in enumerate(episodes):
    p = pad_episode(ep, cfg)
    arrays = {name: jnp.asarray(getattr(p, name)) for name in ('docs', 'queries', 'where', 'positions',
                                                               'doc_tf', 'query_tf')}
    # Leg scores shared by RRF and Tide (computed once, outside the timers).
    cos = jfns['cosine'](arrays)
    bm = jfns['bm25'](arrays)
    cfsr_s = jfns['cfsr'](arrays)
    arrays['legs'] = jnp.stack([cos, bm, cfsr_s])
    arrays['base'] = cos
    n, q = p.n, p.q
    r_q = q if cfg.ref_queries <= 0 else min(q, cfg.ref_queries)
    e_ref = dict(docs=np.asarray(ep[0], np.float64), queries=np.asarray(ep[1], np.float64),
                 query_tokens=list(ep[3]), bm25_index=BM25Okapi([list(t) for t in ep[2]]),
                 legs=np.asarray(arrays['legs'], np.float64)[:, :q, :n],
                 base=np.asarray(cos, np.float64)[:q, :n], positions=np.arange(n, dtype=np.float64))
    for op in ops:
      row = rows[op]
      fn = functools.partial(jfns[op], arrays)
      row.jax_s += _median_time(fn, cfg.repeats)
      out = np.asarray(fn())
      t = time.perf_counter()
      want = [rfns[op](e_ref, i) for i in range(r_q)]
      row.ref_s += (time.perf_counter() - t) * q / r_q
      got = out[:q] if op in ('mmr', 'cfs') else out[:q, :n]
      row.agree += sum(_agrees(op, got[i], want[i]) for i in range(r_q))
      row.checked += r_q
    log(f'episode {e_i + 1}/{len(episodes)}: N={n} (padded {p.docs.shape[0]}), Q={q} (padded '
        f'{p.queries.shape[0]}), reference on {r_q} queries')
  return [rows[op] for op in ops]


def format_table(rows: Sequence[Row], *, n_episodes: int, n_queries: int) -> str:
  lines = [f'{n_episodes} episodes, {n_queries} queries; times are totals over all queries '
           f'(JAX float32 jitted median; NumPy float64 reference)',
           f'| op | JAX ms | NumPy ms | ratio | agree |', '|---|---:|---:|---:|---:|']
  for r in rows:
    lines.append(f'| {r.op} | {1e3 * r.jax_s:.1f} | {1e3 * r.ref_s:.1f} | {r.ratio:.1f}x | '
                 f'{r.agree}/{r.checked} |')
  return '\n'.join(lines)


def main(argv: Sequence[str] | None = None) -> list[Row]:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument('--data', choices=('synthetic', 'locomo'), default='synthetic')
  ap.add_argument('--root', default=None, help='data root for --data locomo')
  ap.add_argument('--cache-dir', default='.cache', help='embedding cache for --data locomo')
  ap.add_argument('--episodes', type=int, default=10, help='synthetic episodes (or the first E of LoCoMo)')
  ap.add_argument('--queries', type=int, default=200, help='synthetic queries per episode')
  ap.add_argument('--repeats', type=int, default=BenchConfig.repeats)
  ap.add_argument('--ref-queries', type=int, default=BenchConfig.ref_queries,
                  help='reference-timed queries per episode (0: all), time scaled to all queries')
  ap.add_argument('--cfsr-batch', type=int, default=BenchConfig.cfsr_batch, help='0: vmap all queries')
  ap.add_argument('--ops', default=','.join(OPS))
  args = ap.parse_args(argv)
  ops = [o for o in args.ops.split(',') if o]
  unknown = set(ops) - set(OPS)
  if unknown:
    ap.error(f'unknown ops {sorted(unknown)}; choose from {OPS}')
  cfg = BenchConfig(repeats=args.repeats, ref_queries=args.ref_queries, cfsr_batch=args.cfsr_batch or None)
  if args.data == 'synthetic':
    episodes = synthetic_episodes(n_episodes=args.episodes, n_queries=args.queries)
  else:
    episodes = locomo_episodes(args.root, cache_dir=args.cache_dir)[:args.episodes]
  print(f'jax {jax.__version__} on {jax.devices()[0].platform} ({jax.device_count()} device(s)); '
        f'{len(episodes)} {args.data} episodes', file=sys.stderr)
  rows = bench_episodes(episodes, cfg, ops=ops, log=lambda s: print(s, file=sys.stderr))
  print(format_table(rows, n_episodes=len(episodes), n_queries=sum(e[1].shape[0] for e in episodes)))
  return rows


if __name__ == '__main__':
  main()
