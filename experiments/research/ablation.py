"""Ablation table of a cross-fitted LoCoMo fit, knob group by knob group, from finished ``experiments.fit`` runs.

Each run (a protocol's output folder) holds its scalar fit (``fitted``) and, when it fit one, its adapter row, per
question. This reads them, checks that every run scored the same questions in the same order, and writes one row per
(run, kind) with its mean and its paired difference from the reference row of the same kind (bootstrap 95% CI and
sign-flip p, :func:`engram_jax.metrics.stats.paired_tests`), plus every row minus the best hand-set row of the reference run.

  python -m experiments.research.ablation --metric ndcg@10 \\
      --run full=outputs/repro/locomo_adapter --run no_fusion=outputs/protocols/locomo_ablate_fusion \\
      --run no_bm25=outputs/protocols/locomo_ablate_bm25 --run no_cfsr=outputs/protocols/locomo_ablate_cfsr \\
      --run full_sq=outputs/protocols/locomo_adapter_sq --reference full

Nothing is fit or scored here: the numbers are those the runs wrote.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from engram_jax.metrics import stats
from experiments.compare import variant_labels, variant_section


def load(run_dir: Path, metric: str) -> dict[str, Any]:
  """A run's per-question rows ``{'scalar': [Q], <variant>: [Q] (each variant of the run, e.g. adapter),
  'hand-set <name>': [Q]}``, its question ids and its fitted knob set."""
  res = json.loads((Path(run_dir) / 'results.json').read_text())
  pq = res['per_question']
  rows = {'scalar': np.asarray(pq['fitted'][metric], np.float64)}
  for label in variant_labels(res):
    rows[label] = np.asarray(variant_section(res, label)['per_question'][metric], np.float64)
  rows[f'hand-set {res["pipeline"]}'] = np.asarray(pq['hand_set'][metric], np.float64)
  for name, scores in pq.get('baselines', {}).items():
    rows[f'hand-set {name}'] = np.asarray(scores[metric], np.float64)
  return {'rows': rows, 'ids': list(pq['question_ids']), 'params': list(res['params'])}


def table(
  runs: dict[str, Path], *, reference: str, metric: str, seed: int = 0, n_resamples: int = 10_000
) -> dict[str, Any]:
  """Every (run, kind) row: mean, minus the reference run's row of the same kind, minus the best hand-set row."""
  loaded = {name: load(d, metric) for name, d in runs.items()}
  if reference not in loaded:
    raise ValueError(f'reference run {reference!r} is not among the runs {list(loaded)}')
  ids = loaded[reference]['ids']
  for name, run in loaded.items():
    if run['ids'] != ids:
      raise ValueError(f'run {name} scored other questions (or another order) than the reference run {reference}')
  ref = loaded[reference]['rows']
  hand = {k: v for k, v in ref.items() if k.startswith('hand-set')}
  best = max(hand, key=lambda k: float(np.mean(hand[k])))
  out = []
  for name, run in loaded.items():
    for kind in [k for k in run['rows'] if not k.startswith('hand-set')]:
      x = run['rows'][kind]
      row = {'run': name, 'kind': kind, 'params': run['params'], 'mean': float(np.mean(x))}
      if kind in ref and name != reference:
        row['minus_reference'] = stats.paired_test(x, ref[kind], seed=seed, n_resamples=n_resamples).to_dict()
      if kind != 'scalar':  # what a variant's components add to the scalar knobs they were fit with
        row['minus_own_scalar'] = stats.paired_test(
          x, run['rows']['scalar'], seed=seed, n_resamples=n_resamples
        ).to_dict()
      row['minus_best_hand_set'] = stats.paired_test(x, hand[best], seed=seed, n_resamples=n_resamples).to_dict()
      out.append(row)
  return {
    'metric': metric,
    'reference': reference,
    'best_hand_set': best,
    'best_hand_set_mean': float(np.mean(hand[best])),
    'n_questions': len(ids),
    'rows': out,
  }


def markdown(t: dict[str, Any]) -> str:
  def pair(p):
    return f'{p["delta"]:+.4f} [{p["lo"]:+.4f}, {p["hi"]:+.4f}], p {p["p"]:.3g}' if p else '(reference)'

  lines = [
    f'| run | row | {t["metric"]} | minus {t["reference"]} (same row) | variant minus its scalar fit | minus '
    f'{t["best_hand_set"]} ({t["best_hand_set_mean"]:.4f}) |',
    '|---|---|---|---|---|---|',
  ]
  for r in t['rows']:
    own = pair(r['minus_own_scalar']) if 'minus_own_scalar' in r else ''
    lines.append(
      f'| {r["run"]} | {r["kind"]} | {r["mean"]:.4f} | {pair(r.get("minus_reference"))} | {own} | '
      f'{pair(r["minus_best_hand_set"])} |'
    )
  return '\n'.join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument('--run', action='append', required=True, help='NAME=RUN_DIR (an experiments.fit output folder)')
  ap.add_argument('--reference', required=True, help='the NAME whose rows the others are paired against')
  ap.add_argument('--metric', default='ndcg@10')
  ap.add_argument('--seed', type=int, default=20261008)
  ap.add_argument('--n-resamples', type=int, default=10_000)
  ap.add_argument('--out', type=Path, default=None, help='write ablation.json and ablation.md here')
  args = ap.parse_args(argv)
  runs = {}
  for spec in args.run:
    name, sep, path = spec.partition('=')
    if not sep or not name or not path:
      raise SystemExit(f'--run expects NAME=RUN_DIR, got {spec!r}')
    runs[name] = Path(path)
  t = table(runs, reference=args.reference, metric=args.metric, seed=args.seed, n_resamples=args.n_resamples)
  md = markdown(t)
  if args.out:
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / 'ablation.json').write_text(json.dumps(t, indent=1))
    (args.out / 'ablation.md').write_text(md + '\n')
  print(md)
  return t


if __name__ == '__main__':
  main()
