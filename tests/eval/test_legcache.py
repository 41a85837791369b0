"""Each leg computed once per sweep within a process: the leg cache gives the uncached results bit for bit, a
fusion-only change recomputes only the fusion, a leg-knob change only that leg, and the cache stays within bounds."""

import json

import jax.numpy as jnp
import numpy as np
import pytest

from engram_jax.core.types import Episode, Item, Question
from engram_jax.eval import evaluation, legcache, pipeline
from engram_jax.ops import rrf

WORDS = 'alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu'.split()


def _episodes(n_eps=3, seed=0, dim=8):
  rng = np.random.default_rng(seed)
  eps, embs = [], []
  for e in range(n_eps):
    n = int(rng.integers(40, 70))
    items = tuple(Item(f'e{e}i{j}', ' '.join(rng.choice(WORDS, 5)), f'p{j // 5}', j) for j in range(n))
    qs = tuple(
      Question(f'e{e}q{j}', ' '.join(rng.choice(WORDS, 3)), (f'e{e}i{int(g)}',), (f'p{int(g) // 5}',), 'c')
      for j, g in enumerate(rng.choice(n, 4, replace=False))
    )
    eps.append(Episode(id=f'e{e}', items=items, questions=qs))
    d = rng.normal(size=(n, dim)).astype(np.float32)
    q = rng.normal(size=(len(qs), dim)).astype(np.float32)
    d[::7] = d[1::7][: len(d[::7])] if len(d[1::7]) >= len(d[::7]) else d[::7]  # some exact score ties
    embs.append((d / np.linalg.norm(d, axis=1, keepdims=True), q / np.linalg.norm(q, axis=1, keepdims=True)))
  return eps, embs


def _stack(cos_w=1.0, bm25_w=1.0, k0=60.0, lam=0.005, name='s'):
  return pipeline.make_pipeline(
    fusion='rrf',
    k0=k0,
    name=name,
    legs={
      'cos': {'op': 'cosine', 'weight': cos_w},
      'bm25': {'op': 'bm25', 'weight': bm25_w},
      'cfsr': {'op': 'cfsr', 'depth': 20, 'weight': 3.0, 'lam': lam, 'pool': 30, 'iterations': 10},
      'cos2': {'op': 'cos2', 'seed': 1},
    },
  )


def _run(pipes, cache=None):
  eps, embs = _episodes()
  return evaluation.evaluate(
    eps, embs, pipes, k=10, metrics=['ndcg@10', 'recall@10'], seed=3, progress=False, leg_cache=cache
  )


@pytest.mark.slow
def test_rrf_from_top_is_rrf_fuse():
  rng = np.random.default_rng(1)
  for _ in range(20):
    n, q = int(rng.integers(5, 40)), 3
    scores = np.round(rng.normal(size=(3, q, n)), 1).astype(np.float32)  # rounded: many ties
    scores[1, :, ::3] = -np.inf  # a leg that ranks only some items
    where = rng.random(n) < 0.85
    depths = [int(rng.integers(1, 50)) for _ in range(3)]
    w, k0 = jnp.asarray(rng.random(3) * 3, jnp.float32), jnp.float32(rng.uniform(1, 100))
    want = rrf.rrf_fuse(jnp.asarray(scores), weights=w, depths=depths, where=jnp.asarray(where), k0=k0)
    tops = [legcache.leg_top(jnp.asarray(s), jnp.asarray(where), d) for s, d in zip(scores, depths)]
    got = legcache.rrf_from_top(
      [t[0] for t in tops], [t[1] for t in tops], weights=w, k0=k0, where=jnp.asarray(where), n=n
    )
    assert np.array_equal(np.asarray(want), np.asarray(got))


@pytest.mark.slow
def test_cached_results_equal_uncached_and_legs_are_reused():
  grid = {
    f'p{i}': _stack(cos_w=cw, bm25_w=bw, k0=k0, name=f'p{i}')
    for i, (cw, bw, k0) in enumerate([(1.0, 1.0, 60.0), (2.0, 0.5, 20.0), (0.5, 3.0, 100.0)])
  }
  grid['alone'] = pipeline.make_pipeline(legs={'cfsr': {'op': 'cfsr', 'pool': 30, 'iterations': 10}}, name='alone')
  plain = _run(grid)
  cache = legcache.LegCache()
  first = _run({'p0': grid['p0'], 'alone': grid['alone']}, cache)
  assert cache.report()['leg_misses'] == 4 and cache.report()['pipeline_misses'] >= 1
  again = _run(grid, cache)  # a fusion-only sweep: every leg served from the cache
  rep = cache.report()
  assert rep['leg_misses'] == 4 and rep['leg_hits'] >= 8 and rep['pipeline_hits'] >= 1
  for name in grid:
    assert again.retrieved[name] == plain.retrieved[name]
    for m in plain.scores[name]:
      assert np.array_equal(again.scores[name][m], plain.scores[name][m])
  assert first.retrieved['p0'] == plain.retrieved['p0']
  lam = _run({'lam': _stack(lam=0.05, name='lam')}, cache)  # only the cfsr leg is recomputed
  assert cache.report()['leg_misses'] == rep['leg_misses'] + 1  # one group (4 legs, 4 misses above): cfsr only
  # and of the cfsr leg, only its solve: its cosine pools and Grams (stages.prepare) come from the cache
  assert cache.report()['prepared_misses'] == rep['prepared_misses'] and cache.report()['prepared_hits'] >= 1
  assert lam.retrieved['lam'] == _run({'lam': _stack(lam=0.05, name='lam')}).retrieved['lam']


def test_arrays_given_by_the_caller_are_fingerprinted_and_reuse_legs():
  """The path of experiments.fit's gap monitor and search_compare's trials: arrays built by the caller, then many
  evaluations at other knob values. A k0 change reuses every leg; results equal the uncached run bit for bit."""
  from engram_jax.core.batch import episode_arrays

  eps, embs = _episodes(seed=4)

  def light(k0):  # cosine + BM25 only: the path under test, without CFS-R's compile time
    return pipeline.make_pipeline(fusion='rrf', k0=k0, name='s', legs={'cos': {'op': 'cosine'}, 'bm25': {'op': 'bm25'}})

  arrays = [episode_arrays(e, d, q, **evaluation.build_options([light(60.0)])) for e, (d, q) in zip(eps, embs)]
  cache = legcache.LegCache()
  for k0 in (60.0, 20.0):
    pipes = {'s': light(k0)}
    got = evaluation.evaluate(
      eps, None, pipes, k=10, metrics=['ndcg@10'], seed=3, progress=False, arrays=arrays, leg_cache=cache
    )
    want = evaluation.evaluate(eps, None, pipes, k=10, metrics=['ndcg@10'], seed=3, progress=False, arrays=arrays)
    assert got.retrieved['s'] == want.retrieved['s']
    assert np.array_equal(got.scores['s']['ndcg@10'], want.scores['s']['ndcg@10'])
  rep = cache.report()
  assert rep['leg_hits'] >= rep['leg_misses'] > 0


def test_the_cache_is_bounded():
  cache = legcache.LegCache(max_bytes=1000)
  cache.get('leg', 'a', lambda: np.zeros(100, np.int32))  # 400 bytes
  cache.get('leg', 'b', lambda: np.zeros(100, np.int32))
  cache.get('leg', 'c', lambda: np.zeros(100, np.int32))  # evicts a
  assert cache.bytes == 800 and cache.report()['evictions'] == 1
  assert cache.get('leg', 'b', lambda: pytest.fail('b was evicted')) is not None
  big = cache.get('leg', 'd', lambda: np.zeros(1000, np.int32))  # larger than the bound: returned, not stored
  assert big.size == 1000 and cache.bytes == 800
  with pytest.raises(ValueError, match='max_bytes must be >= 0'):
    legcache.LegCache(max_bytes=-1)


@pytest.mark.slow
def test_a_multirun_in_one_process_writes_what_separate_processes_write(tmp_path):
  """A basic-launcher sweep over fusion knobs and a CFS-R knob (legs and data cached across its jobs) writes each
  job's results.json byte for byte as a separate process with that job's overrides does."""
  import os
  import subprocess
  import sys
  from pathlib import Path

  from engram_jax.data import io

  try:
    if not (io.resolve_data_root() / 'locomo' / 'locomo10.json').is_file():
      pytest.skip('LoCoMo not found under the data root')
  except FileNotFoundError:
    pytest.skip('no data root')
  root, env = Path(__file__).resolve().parents[2], {**os.environ, 'JAX_PLATFORMS': 'cpu'}
  s = 'pipeline.rrf_cos_bm25_cfsr'
  base = [
    sys.executable,
    '-m',
    'experiments.evaluate',
    'pipeline=[rrf_cos_bm25_cfsr]',
    'embedder=hashing',
    'dataset.loader.conversations=[conv-30,conv-26]',
    'eval.n_resamples=100',
    'eval.progress=false',
    f'paths.cache_dir={tmp_path}/cache',
  ]
  sweep = [f'++{s}.legs.cos.weight=1.0,2.0', f'++{s}.k0=20,60', f'++{s}.legs.cfsr.lam=0.005,0.05']
  subprocess.run(
    base[:3] + ['-m'] + base[3:] + [*sweep, f'hydra.sweep.dir={tmp_path}/multi'],
    check=True,
    cwd=root,
    capture_output=True,
    env=env,
  )
  jobs = [(c, k, l) for c in ('1.0', '2.0') for k in ('20', '60') for l in ('0.005', '0.05')]
  infos = [json.loads((tmp_path / 'multi' / str(i) / 'run_info.json').read_text()) for i in range(len(jobs))]
  assert infos[-1]['leg_cache']['leg_hits'] >= 1 and infos[-1]['leg_cache']['arrays_hits'] >= 1
  for i in (0, 3, 6):  # some jobs, each in its own process (cache empty)
    c, k, l = jobs[i]
    subprocess.run(
      base
      + [
        f'++{s}.legs.cos.weight={c}',
        f'++{s}.k0={k}',
        f'++{s}.legs.cfsr.lam={l}',
        f'hydra.run.dir={tmp_path}/single{i}',
      ],
      check=True,
      cwd=root,
      capture_output=True,
      env=env,
    )
    assert (tmp_path / f'single{i}' / 'results.json').read_bytes() == (
      tmp_path / 'multi' / str(i) / 'results.json'
    ).read_bytes()
