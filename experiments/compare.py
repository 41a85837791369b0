"""Paired tests between pipelines of finished runs (same questions), from their results.json files.

  python -m experiments.compare outputs/tables/cfs_table/results.json \
      --pairs rrf_cos_bm25_cfs:rrf_cos_cos2_bm25_e30 rrf_cos_bm25_cfs_long:rrf_cos_bm25_cos2_long_e30

Several files may be given; pipelines are looked up across them by name and matched by question id, so
two runs of the same dataset compare as paired. Without --pairs every pipeline is compared with the first.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from engram_jax.metrics import report


def per_question_scores(paths: list[Path], dataset: str | None = None) -> dict[str, dict[str, dict[str, float]]]:
  """pipeline -> question id -> metric -> value, across runs (a multi-dataset run needs ``dataset``)."""
  out: dict[str, dict[str, dict[str, float]]] = {}
  for path in paths:
    res = json.loads(path.read_text())
    if 'datasets' in res:
      if dataset is None:
        raise ValueError(f'{path} holds several datasets {sorted(res["datasets"])}: pass --dataset')
      res = res['datasets'][dataset]
    for row in res['per_question']:
      for name, ms in row['scores'].items():
        out.setdefault(name, {})[row['id']] = ms
  return out


def compare(scores, pairs: list[tuple[str, str]], *, seed: int, n_resamples: int) -> list[dict]:
  rows = []
  for a, b in pairs:
    for name in (a, b):
      if name not in scores:
        raise ValueError(f'unknown pipeline {name!r}; known: {sorted(scores)}')
    common = sorted(set(scores[a]) & set(scores[b]))
    if not common:
      raise ValueError(f'{a} and {b} share no questions')
    for m in scores[a][common[0]]:
      x = np.array([scores[a][q][m] for q in common])
      y = np.array([scores[b][q][m] for q in common])
      rows.append(
        {'a': a, 'b': b, 'metric': m, 'n': len(common), **report.paired(x, y, m, seed=seed, n_resamples=n_resamples)}
      )
  return rows


def main(argv: list[str] | None = None) -> list[dict]:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('results', nargs='+', type=Path)
  p.add_argument('--pairs', nargs='*', default=None, help='A:B pairs (A minus B)')
  p.add_argument('--dataset', default=None)
  p.add_argument('--seed', type=int, default=20261008)
  p.add_argument('--n-resamples', type=int, default=10_000)
  args = p.parse_args(argv)
  scores = per_question_scores(args.results, args.dataset)
  names = list(scores)
  pairs = [tuple(x.split(':', 1)) for x in args.pairs] if args.pairs else [(n, names[0]) for n in names[1:]]
  rows = compare(scores, pairs, seed=args.seed, n_resamples=args.n_resamples)
  print('| A | B | metric | n | delta (A - B) | 95% CI | p | McNemar p |\n|---|---|---|---|---|---|---|---|')
  for r in rows:
    mc = f'{r["mcnemar_p"]:.4f}' if 'mcnemar_p' in r else ''
    print(
      f'| {r["a"]} | {r["b"]} | {r["metric"]} | {r["n"]} | {r["delta"]:+.4f} | [{r["lo"]:+.4f}, {r["hi"]:+.4f}] '
      f'| {r["p"]:.4f} | {mc} |'
    )
  return rows


if __name__ == '__main__':
  main()
