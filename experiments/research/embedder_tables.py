"""The CFS-R table across embedders, generated from finished run folders (issue 44 item 3).

    python -m experiments.research.embedder_tables hashing=RUN_H MiniLM=RUN_M mpnet=RUN_P --out docs/embedders_cfsr.md

Each ``LABEL=RUN`` is the run folder of ``python -m experiments.evaluate experiment=cfsr_table embedder=...`` (whole:
its ``run_complete.json`` is checked first). Written: ndcg@10 and recall@10 per pipeline (rows) and embedder
(columns), the published text-embedding-3-small rows beside them (the runs' ``reference``, checked to occur in the
CFS-R post under the seeds folder when it is there), ndcg@10 per LoCoMo category, and the paired differences the CFS-R
post reports (the CFS-R stack against plain RRF, tuned MMR and CFS-long): against RRF the run's own paired test
(``results.json``), against the other two the same test computed here from the per-question scores with the run's
seed.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from engram_jax.core import runfolder
from engram_jax.core.errors import EngramError

STACK = 'rrf_cos_bm25_cfsr'
COMPARISONS = ('rrf_cos_bm25', 'rrf_cos_bm25_mmr_tuned', 'rrf_cos_bm25_cfs_long')  # the CFS-R post's
METRICS = ('ndcg@10', 'recall@10')
SEED_MARK = 'CFS-R'  # the CFS-R post is the seed text that names it in its first lines


def load_run(folder: str | Path) -> dict[str, Any]:
  """``results.json`` of a whole evaluate run folder of one dataset (refused in one line otherwise)."""
  folder = Path(folder)
  runfolder.check(folder, ['results.json'])
  results = json.loads((folder / 'results.json').read_text())
  if 'pipelines' not in results:
    raise EngramError(f'{folder}: not a one-dataset evaluate run (results.json has no pipelines)')
  return results


def seed_text(seeds: Path | None) -> tuple[str, str] | None:
  """(file name, text) of the CFS-R post among the seed texts, if found."""
  if seeds is None or not seeds.is_dir():
    return None
  for path in sorted(seeds.glob('*.txt')):
    text = path.read_text(encoding='utf-8', errors='replace')
    if SEED_MARK in text[:2000] and 'rrf(cos, BM25, CFS-R' in text:
      return path.name, text
  return None


def check_reference(reference: Mapping[str, Mapping[str, float]], seed: tuple[str, str] | None) -> list[str]:
  """The published numbers that do not occur in the seed text (as printed there, 4 decimals)."""
  if seed is None:
    return []
  return [f'{pipe} {m} {v:.4f}' for pipe, row in reference.items() for m, v in row.items() if f'{v:.4f}' not in seed[1]]


def per_question(results: Mapping[str, Any], pipe: str, metric: str) -> np.ndarray:
  """``[Q]`` float64 scores of ``pipe`` on ``metric`` in a run's results.json, in its question order."""
  return np.asarray([q['scores'][pipe][metric] for q in results['per_question']], np.float64)


def stack_vs(results: Mapping[str, Any], other: str, metric: str = 'ndcg@10') -> dict[str, float] | None:
  """The CFS-R stack minus ``other``: the run's own paired test when it made one, else the same test from the
  per-question scores (bootstrap CI, sign-flip p, the run's seed)."""
  from engram_jax.metrics import paired_test

  pipes = results['pipelines']
  if STACK not in pipes or other not in pipes:
    return None
  own = pipes[STACK].get('paired', {}).get(f'vs {other}', {}).get(metric)
  if own is not None:
    return {**own, 'source': 'run'}
  r = paired_test(per_question(results, STACK, metric), per_question(results, other, metric), seed=results['seed'])
  return {'delta': r.delta, 'lo': r.lo, 'hi': r.hi, 'p': r.p, 'n': len(results['per_question']), 'source': 'here'}


def _p(p: float) -> str:
  return f'{p:.2g}' if p >= 0.001 else '<0.001'


def tables(runs: Mapping[str, Mapping[str, Any]], *, seed: tuple[str, str] | None = None) -> str:
  """The Markdown of the cross-embedder tables for ``{label: results}`` (in the given order)."""
  labels = list(runs)
  first = runs[labels[0]]
  pipes = list(dict.fromkeys(p for r in runs.values() for p in r['pipelines']))
  reference = first.get('reference') or {}
  n = {r['n_questions'] for r in runs.values()}
  if len(n) != 1:
    raise EngramError(f'the runs scored different numbers of questions ({sorted(n)}): not one table')
  src = f'the CFS-R post, `{seed[0]}` of the seeds' if seed else 'the CFS-R post (as the runs record it)'
  out = [
    f'**LoCoMo, {n.pop()} questions, k = 10, `experiment=cfsr_table`**, one run per embedder (95% bootstrap CIs); '
    f'published: {src}, text-embedding-3-small, another embedder and setup.',
    '',
  ]
  for metric in METRICS:
    head = [f'{metric}: pipeline', *labels, 'published (text-embedding-3-small)']
    out += ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for pipe in pipes:
      cells = []
      for label in labels:
        row = runs[label]['pipelines'].get(pipe)
        cells.append(
          '-' if row is None else f'{row[metric]:.4f} [{row["ci95"][metric][0]:.3f}, {row["ci95"][metric][1]:.3f}]'
        )
      pub = reference.get(pipe, {}).get(metric)
      out.append(f'| `{pipe}` | ' + ' | '.join(cells) + f' | {"-" if pub is None else f"{pub:.4f}"} |')
    out.append('')
  cats = list(dict.fromkeys(c for r in runs.values() for p in r['pipelines'].values() for c in p['by_category']))
  count = lambda cat: (first['pipelines'][pipes[0]]['by_category'].get(cat) or {}).get('n', '?')
  head = ['ndcg@10 by category: pipeline', *(f'{cat} n={count(cat)}' for cat in cats)]
  out += [f'ndcg@10 by category, each cell {" / ".join(labels)}:', '']
  out += ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
  for pipe in pipes:
    cells = []
    for cat in cats:
      vals = [runs[label]['pipelines'].get(pipe, {}).get('by_category', {}).get(cat) for label in labels]
      cells.append(' / '.join('-' if v is None else f'{v["ndcg@10"]:.3f}' for v in vals))
    out.append(f'| `{pipe}` | ' + ' | '.join(cells) + ' |')
  out.append('')
  head = ['ndcg@10: CFS-R stack minus', *labels]
  out += ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
  for other in COMPARISONS:
    cells = []
    for label in labels:
      t = stack_vs(runs[label], other)
      cells.append(
        '-'
        if t is None
        else f'{t["delta"]:+.4f} [{t["lo"]:+.4f}, {t["hi"]:+.4f}] p {_p(t["p"])}'
        if t['source'] == 'run'
        else f'{t["delta"]:+.4f} [{t["lo"]:+.4f}, {t["hi"]:+.4f}] p {_p(t["p"])} *'
      )
    out.append(f'| `{other}` | ' + ' | '.join(cells) + ' |')
  out += [
    '',
    "Paired bootstrap 95% CIs and sign-flip p over the same questions; against `rrf_cos_bm25` the run's own test "
    "(`results.json`), * computed here from the per-question scores with the run's seed. The CFS-R post reports, "
    'with text-embedding-3-small: +1.17 pp [+0.66, +1.69] against tuned MMR and +0.85 pp [+0.33, +1.35] against '
    'CFS-long (+2.51 pp against plain RRF, 0.5447 - 0.5196, without a CI).',
  ]
  return '\n'.join(out) + '\n'


def main(argv: Sequence[str] | None = None) -> str:
  ap = argparse.ArgumentParser(prog='python -m experiments.research.embedder_tables', description=__doc__)
  ap.add_argument('runs', nargs='+', metavar='LABEL=RUN', help='an embedder label and its cfsr_table run folder')
  ap.add_argument('--seeds', default=None, help='the seed texts (default: ../shared/seeds beside the checkout)')
  ap.add_argument('--out', default=None, help='write the Markdown here (else print it)')
  args = ap.parse_args(argv)
  runs = {}
  for item in args.runs:
    label, sep, folder = item.partition('=')
    if not sep or not label or not folder:
      ap.error(f'expected LABEL=RUN, got {item!r}')
    runs[label] = load_run(folder)
  seeds = Path(args.seeds) if args.seeds else Path(__file__).resolve().parents[3] / 'shared' / 'seeds'
  seed = seed_text(seeds)
  missing = check_reference(next(iter(runs.values())).get('reference') or {}, seed)
  if missing:
    raise EngramError(f'published numbers not found in the CFS-R post {seed[0]}: {missing}')
  text = tables(runs, seed=seed)
  if args.out:
    Path(args.out).write_text(text)
  else:
    print(text, end='')
  return text


if __name__ == '__main__':
  main()
