"""Gradient fit vs search: the same knobs, the same training episodes, held-out NDCG@10 and compute spent.

Two entry points:

* the Hydra app (config ``conf/fit_search.yaml``): one job scores one setting of knobs (``values.*``) by hard
  NDCG@10 on the training episodes of the seeded hold-out split and returns it, so that a sweeper can
  search: ``-m`` with the basic sweeper runs a grid, ``hydra/sweeper=optuna`` runs TPE (hydra-optuna-sweeper);
* ``python -m experiments.research.search_compare --compare [--out DIR] [overrides...]``: runs the gradient fit, the
  grid and optuna on the same split, scores each one's best setting on the held-out episodes and writes
  ``compare.json`` / ``compare.md``.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import hydra
import numpy as np
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from engram_jax import fit
from engram_jax.data import splits
from engram_jax.eval import evaluation, pipeline
from experiments import fit as fit_exp
from experiments.lib import common, fit_setup

log = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[2]
GRID = {'values.legs.bm25.weight': [0.5, 1.0, 1.5, 2.0, 3.0], 'values.k0': [5, 15, 30, 60]}
SPACE = {'values.legs.bm25.weight': 'tag(log,interval(0.25,4.0))', 'values.k0': 'tag(log,interval(2.0,100.0))'}
N_TRIALS = 20


def flat_values(node) -> dict[str, float]:
  """``{legs: {bm25: {weight: 2}}, k0: 30}`` -> ``{'legs.bm25.weight': 2.0, 'k0': 30.0}``."""
  out = {}

  def walk(prefix, x):
    if isinstance(x, dict):
      for k, v in x.items():
        walk(f'{prefix}.{k}' if prefix else str(k), v)
    else:
      out[prefix] = float(x)

  walk('', OmegaConf.to_container(node) if not isinstance(node, dict) else node)
  return out


def split_episodes(cfg: DictConfig, episodes) -> tuple[list[int], list[int]]:
  config = fit_setup.read(cfg).config
  train, test = fit.holdout_split([e.id for e in episodes], n_test=config.n_test, seed=config.seed)
  splits.assert_disjoint(train, test)
  splits.assert_disjoint_content([e for e in episodes if e.id in train], [e for e in episodes if e.id in test])
  return ([i for i, e in enumerate(episodes) if e.id in train], [i for i, e in enumerate(episodes) if e.id in test])


def score(cfg: DictConfig, pipe, data, sel: list[int]) -> np.ndarray:
  episodes, embeddings, arrays = data
  r = evaluation.evaluate(
    [episodes[i] for i in sel],
    [embeddings[i] for i in sel],
    {'p': pipe},
    k=int(cfg.eval.k),
    metrics=['ndcg@10'],
    seed=int(cfg.seed),
    progress=False,
    arrays=[arrays[i] for i in sel],
    leg_cache=common.leg_cache(common.eval_settings(cfg)),
  )  # legs whose knobs a trial leaves alone: computed once
  return r.scores['p']['ndcg@10']


@hydra.main(version_base='1.3', config_path='../../conf', config_name='fit_search')
def main(cfg: DictConfig) -> float:
  t0 = time.perf_counter()
  name = list(cfg.pipeline)[0]
  values = flat_values(cfg['values'])
  pipe = pipeline.with_values(common.hand_set_pipeline(name, cfg.pipeline[name]), values)
  data = fit_exp.prepare(cfg)
  train, _ = split_episodes(cfg, data[0])
  ndcg = float(score(cfg, pipe, data, train).mean())
  out = Path(HydraConfig.get().runtime.output_dir)
  out.mkdir(parents=True, exist_ok=True)
  (out / 'objective.json').write_text(
    json.dumps({'values': values, 'train_ndcg@10': ndcg, 'wall_s': time.perf_counter() - t0})
  )
  return ndcg


def _sweep(args: list[str], sweep_dir: Path) -> tuple[list[dict], float]:
  t0 = time.perf_counter()
  cmd = [
    sys.executable,
    '-m',
    'experiments.research.search_compare',
    '-m',
    *args,
    f'hydra.sweep.dir={sweep_dir}',
    'eval.progress=false',
  ]
  subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True)
  wall = time.perf_counter() - t0
  return [json.loads(p.read_text()) for p in sorted(sweep_dir.glob('*/objective.json'))], wall


def compare(out: Path, overrides: list[str]) -> dict:
  """Gradient fit vs grid vs optuna on rrf_cos_bm25's (cosine weight, BM25 weight, k0); see module doc."""
  with initialize_config_dir(config_dir=str(ROOT / 'conf'), version_base='1.3'):
    cfg = compose(config_name='fit_search', overrides=overrides)
  name = list(cfg.pipeline)[0]
  hand = common.hand_set_pipeline(name, cfg.pipeline[name])
  data = fit_exp.prepare(cfg)
  train, test = split_episodes(cfg, data[0])
  rows_out = {}
  base = score(cfg, hand, data, test)
  rows_out['hand-set'] = {
    'values': {},
    'train_ndcg@10': float(score(cfg, hand, data, train).mean()),
    'test': base,
    'wall_s': 0.0,
    'evaluations': '0',
  }

  # gradient: the same training episodes (the hold-out fold of experiments.fit with these settings)
  t0 = time.perf_counter()
  plan = fit_setup.build(cfg, hand, name)  # every fit.* setting, as experiments.fit reads it
  episodes, _, arrays = data
  rows = fit_setup.rows(plan, hand, episodes, arrays, seed=int(cfg.seed))
  row_ep = np.asarray([e.id for e in episodes for _ in e.questions])
  train_rows = np.flatnonzero(np.isin(row_ep, [episodes[i].id for i in train]))
  fit.check_disjoint(
    [q.id for e in episodes for q in e.questions],
    train_rows,
    np.flatnonzero(np.isin(row_ep, [episodes[i].id for i in test])),
  )
  res = fit_setup.fit_rows(plan, rows, train_rows)
  wall = time.perf_counter() - t0
  fitted = pipeline.with_values(hand, res.values)
  rows_out['gradient (adam)'] = {
    'values': res.values,
    'train_ndcg@10': float(score(cfg, fitted, data, train).mean()),
    'test': score(cfg, fitted, data, test),
    'wall_s': wall,
    'evaluations': f'{plan.steps} steps x {plan.batch_size} questions (soft) '
    f'= {plan.steps * plan.batch_size / len(train_rows):.1f} training-set passes',
  }

  # grid (basic sweeper) and TPE (optuna sweeper), each job one hard pass over the training episodes
  grid_args = [f'{k}={",".join(str(v) for v in vs)}' for k, vs in GRID.items()] + overrides
  optuna_args = [
    'hydra/sweeper=optuna',
    'hydra.sweeper.direction=maximize',
    f'hydra.sweeper.n_trials={N_TRIALS}',
    'hydra.sweeper.n_jobs=1',
    f'hydra.sweeper.sampler.seed={int(cfg.seed)}',
    *[f'{k}={v}' for k, v in SPACE.items()],
  ] + overrides
  for label, args in (('grid (basic sweeper)', grid_args), ('optuna TPE (optuna sweeper)', optuna_args)):
    jobs, wall = _sweep(args, out / label.split()[0])
    best = max(jobs, key=lambda j: j['train_ndcg@10'])
    pipe = pipeline.with_values(hand, best['values'])
    rows_out[label] = {
      'values': best['values'],
      'train_ndcg@10': best['train_ndcg@10'],
      'test': score(cfg, pipe, data, test),
      'wall_s': wall,
      'evaluations': f'{len(jobs)} hard training-set passes',
    }

  seed = int(cfg.seed)
  from engram_jax.metrics import stats

  table = [
    '| method | knobs found | train NDCG@10 | held-out NDCG@10 [95% CI] | vs hand-set (paired) | wall s | '
    'evaluations |',
    '|---|---|---|---|---|---|---|',
  ]
  summary = {}
  for label, r in rows_out.items():
    ci = stats.bootstrap_ci(r['test'], seed=seed, n_resamples=int(cfg.eval.n_resamples))
    pt = stats.paired_test(r['test'], base, seed=seed, n_resamples=int(cfg.eval.n_resamples))
    knobs_s = ', '.join(f'{k}={v:.3g}' for k, v in r['values'].items()) or 'hand-set'
    table.append(
      f'| {label} | {knobs_s} | {r["train_ndcg@10"]:.4f} | {ci.mean:.4f} [{ci.lo:.4f}, {ci.hi:.4f}] | '
      f'{pt.delta:+.4f} [{pt.lo:+.4f}, {pt.hi:+.4f}] | {r["wall_s"]:.1f} | {r["evaluations"]} |'
    )
    summary[label] = {
      **{k: v for k, v in r.items() if k != 'test'},
      'test_ndcg@10': ci.to_dict(),
      'vs_hand_set': pt.to_dict(),
    }
  head = (
    f'### {name}: gradient fit vs search on the same split (seed {plan.seed}; train '
    f'{[data[0][i].id for i in train]}, held out {[data[0][i].id for i in test]})\n'
  )
  text = head + '\n' + '\n'.join(table) + '\n'
  out.mkdir(parents=True, exist_ok=True)
  (out / 'compare.json').write_text(json.dumps(summary, indent=1))
  (out / 'compare.md').write_text(text)
  print(text)
  return summary


if __name__ == '__main__':
  if '--compare' in sys.argv:
    argv = [a for a in sys.argv[1:] if a != '--compare']
    out_dir = Path('outputs/search') / time.strftime('compare_%Y-%m-%d_%H-%M-%S')
    if '--out' in argv:
      i = argv.index('--out')
      out_dir = Path(argv[i + 1])
      del argv[i : i + 2]
    compare(out_dir, argv)
  else:
    main()
