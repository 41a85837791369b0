"""Gradient fit vs Optuna TPE vs grid at EQUAL wall-clock budget, in one process (persistent compile cache on).

    python -m experiments.research.search_budget [--out DIR] [overrides...]      # default: LoCoMo, rrf_cos_bm25_cfsr, 8 knobs

Same knobs (``fit.params``: locomo_full's 8 by default), same seeded hold-out split as ``experiments.search_compare``
(``fit.n_test`` conversations held out), same objective for the black-box methods (hard NDCG@10 over the training
conversations). The gradient fit (soft twins, adam, ``fit.steps`` minibatches) runs first; its wall time (rows,
compilation and steps) is the budget. TPE (``optuna.samplers.TPESampler``, seeded; the hand-set point is its first
trial) and a grid (3 values per knob: low, hand-set, high, 3^K points visited in a seeded random order, hand-set
first) then evaluate until that budget is spent (a trial started before the deadline finishes). The exhaustive grid
(every one of the 3^K points in one :func:`engram_jax.eval.grid.evaluate_grid` call) is a row at its own wall time,
and its best point is paired against the gradient fit on the held-out questions. Each method's best
setting on the training conversations is scored once on the held-out ones. Every evaluation runs in this process:
pipelines that differ only in traced knobs compile to the same program, served by the persistent compile cache.

For question-conditioned knobs and the query adapter (thousands of parameters: 3,136 for the conditioned module of
``locomo_cond``, 6,144 for a rank-8 adapter at D = 384) no black-box search is run: at a few hard evaluations per
budget it cannot even visit one point per dimension.
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from pathlib import Path

import numpy as np
from hydra import compose, initialize_config_dir

from engram_jax import fit
from engram_jax.eval import grid, pipeline
from engram_jax.metrics import stats
from experiments import fit as fit_exp
from experiments.lib import common, fit_setup
from experiments.research.search_compare import ROOT, score, split_episodes

# search ranges per knob kind (log-uniform for scales): (low, high, log)
RANGES = {
  'weight': (0.1, 10.0, True),
  'k0': (1.0, 100.0, True),
  'lam': (1e-4, 0.1, True),
  'w': (0.0, 1.0, False),
  'k1': (0.05, 3.0, True),
  'b': (0.0, 1.0, False),
}


EXHAUSTIVE = 'grid, exhaustive (one call)'


def knob_range(path: str) -> tuple[float, float, bool]:
  return RANGES[path.rsplit('.', 1)[-1]]


def exhaustive_grid(cfg, hand: pipeline.Pipeline, params: list[str], levels: list[list[float]], data, train) -> dict:
  """The exhaustive grid row, at its own wall time: every point of ``levels`` (one list per knob of ``params``) on
  the training conversations, in one :func:`engram_jax.eval.grid.evaluate_grid` call (each leg once per value of
  its own knobs, the fusion batched); the best point by mean training NDCG@10 (ties: the first point)."""
  episodes, embeddings, arrays = data
  t0 = time.perf_counter()
  res = grid.evaluate_grid(
    [episodes[i] for i in train],
    [embeddings[i] for i in train],
    hand,
    dict(zip(params, levels)),
    k=int(cfg.eval.k),
    metrics=['ndcg@10'],
    seed=int(cfg.seed),
    arrays=[arrays[i] for i in train],
    chunk=int(cfg.eval.get('grid_chunk', 64)),
  )
  means = res.means('ndcg@10')
  best = int(np.argmax(means))
  return {
    'values': res.point(best),
    'wall_s': time.perf_counter() - t0,
    'evaluations': f'all {res.n_points} points, one call',
    'train': float(means[best]),
  }


def main(argv: list[str]) -> dict:
  out = Path('outputs/search') / time.strftime('budget_%Y-%m-%d_%H-%M-%S')
  if '--out' in argv:
    i = argv.index('--out')
    out = Path(argv[i + 1])
    del argv[i : i + 2]
  with initialize_config_dir(config_dir=str(ROOT / 'conf'), version_base='1.3'):
    cfg = compose(
      config_name='fit',
      overrides=[
        'pipeline=[rrf_cos_bm25_cfsr]',
        'fit.split=holdout',
        'eval.progress=false',
        'fit.params=[legs.cos.weight,legs.bm25.weight,legs.cfsr.weight,legs.cfsr.lam,legs.cfsr.w,legs.bm25.k1,'
        'legs.bm25.b,k0]',
        *argv,
      ],
    )
  common.enable_compile_cache(cfg)
  name = list(cfg.pipeline)[0]
  hand = common.hand_set_pipeline(name, cfg.pipeline[name])
  params = list(fit_setup.read(cfg).config.params)
  data = fit_exp.prepare(cfg, pipeline.build_options([hand]))
  train, test = split_episodes(cfg, data[0])
  episodes, _, arrays = data
  seed = int(cfg.seed)
  rows_out: dict[str, dict] = {}

  plan = fit_setup.build(cfg, hand, name)  # every fit.* setting, as experiments.fit reads it
  every = plan.every
  t0 = time.perf_counter()
  rows = fit.build_rows(plan.problem, hand, episodes, arrays, seed=seed)
  t_rows = time.perf_counter() - t0
  if plan.check_twins:  # outside the budget: it checks the soft twins, it fits nothing
    fit_setup.check_twins(
      plan.problem, rows, episodes, arrays, every, seed=seed, max_questions=plan.check_twins_questions
    )
  t0 = time.perf_counter()
  row_ep = np.asarray([e.id for e in episodes for _ in e.questions])
  train_rows = np.flatnonzero(np.isin(row_ep, [episodes[i].id for i in train]))
  fit.check_disjoint(
    [q.id for e in episodes for q in e.questions],
    train_rows,
    np.flatnonzero(np.isin(row_ep, [episodes[i].id for i in test])),
  )
  res = fit_setup.fit_rows(plan, rows, train_rows)
  budget = t_rows + time.perf_counter() - t0
  rows_out['gradient (adam, soft twins)'] = {
    'values': res.values,
    'wall_s': budget,
    'evaluations': f'{plan.steps} minibatch steps',
  }
  hand_values = {p: float(every[p]) for p in params}

  def objective(values: dict[str, float]) -> float:
    return float(score(cfg, pipeline.with_values(hand, values), data, train).mean())

  # TPE
  import optuna

  optuna.logging.set_verbosity(optuna.logging.WARNING)
  study = optuna.create_study(direction='maximize', sampler=optuna.samplers.TPESampler(seed=seed))
  study.enqueue_trial(hand_values)
  t0 = time.perf_counter()
  while time.perf_counter() - t0 < budget or not study.trials:
    trial = study.ask()
    values = {p: trial.suggest_float(p, *knob_range(p)[:2], log=knob_range(p)[2]) for p in params}
    study.tell(trial, objective(values))
  rows_out['optuna TPE'] = {
    'values': study.best_params,
    'wall_s': time.perf_counter() - t0,
    'evaluations': f'{len(study.trials)} hard training passes',
    'train': study.best_value,
  }

  # grid: low, hand-set, high per knob, seeded random order, hand-set first
  levels = [sorted({knob_range(p)[0], hand_values[p], knob_range(p)[1]}) for p in params]
  order = np.random.default_rng(seed).permutation(int(np.prod([len(l) for l in levels])))
  points = list(itertools.product(*levels))
  best, best_v, n = None, -np.inf, 0
  t0 = time.perf_counter()
  for j in [None, *order]:
    if n and time.perf_counter() - t0 >= budget:
      break
    values = hand_values if j is None else dict(zip(params, points[int(j)]))
    v = objective(values)
    n += 1
    if v > best_v:
      best, best_v = values, v
  rows_out['grid (3 levels per knob)'] = {
    'values': best,
    'wall_s': time.perf_counter() - t0,
    'evaluations': f'{n} of {len(points)} points',
  }
  rows_out[EXHAUSTIVE] = exhaustive_grid(cfg, hand, params, levels, data, train)
  base = score(cfg, hand, data, test)
  table = [
    '| method | train NDCG@10 | held-out NDCG@10 [95% CI] | vs hand-set (paired) | wall s | evaluations |',
    '|---|---|---|---|---|---|',
  ]
  summary, held_out = {}, {}
  for label, r in [('hand-set', {'values': hand_values, 'wall_s': 0.0, 'evaluations': '0'}), *rows_out.items()]:
    pipe = pipeline.with_values(hand, r['values'])
    held = held_out[label] = score(cfg, pipe, data, test)
    tr = r.get('train', objective(r['values']))
    ci = stats.bootstrap_ci(held, seed=seed, n_resamples=int(cfg.eval.n_resamples))
    pt = stats.paired_test(held, base, seed=seed, n_resamples=int(cfg.eval.n_resamples))
    table.append(
      f'| {label} | {tr:.4f} | {ci.mean:.4f} [{ci.lo:.4f}, {ci.hi:.4f}] | '
      f'{pt.delta:+.4f} [{pt.lo:+.4f}, {pt.hi:+.4f}] | {r["wall_s"]:.1f} | {r["evaluations"]} |'
    )
    summary[label] = {**r, 'train_ndcg@10': tr, 'test_ndcg@10': ci.to_dict(), 'vs_hand_set': pt.to_dict()}
  import os

  gradient = 'gradient (adam, soft twins)'
  vs = stats.paired_test(
    held_out[EXHAUSTIVE], held_out[gradient], seed=seed, n_resamples=int(cfg.eval.n_resamples)
  ).to_dict()
  summary[EXHAUSTIVE]['vs_gradient'] = vs
  text = (
    f'### {name}, {len(params)} knobs: gradient vs TPE vs grid at equal wall budget ({budget:.1f}s; train '
    f'{[episodes[i].id for i in train]}, held out {[episodes[i].id for i in test]}; load average '
    f'{os.getloadavg()[0]:.1f})\n\n' + '\n'.join(table) + '\n\n'
    'The best training point of the exhaustive grid against the gradient fit, held out (paired): '
    f'{vs["delta"]:+.4f} [{vs["lo"]:+.4f}, {vs["hi"]:+.4f}], p = {vs["p"]:.4f} ({vs["n"]} questions).\n'
  )
  out.mkdir(parents=True, exist_ok=True)
  (out / 'budget.json').write_text(json.dumps(summary, indent=1, default=float))
  (out / 'budget.md').write_text(text)
  print(text)
  return summary


if __name__ == '__main__':
  main(sys.argv[1:])
