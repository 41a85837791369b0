"""The seeds' tables re-read on the default lexical leg: each seed claim on the seeds' BM25 (`bm25`) and on `bm25en`
(protocol ``lexical_default``), per embedder, with paired 95% intervals, overall and per LoCoMo category.

  python -m experiments.research.lexical_tables \\
      --cfsr hashing=RUN minilm=RUN --cfs hashing=RUN minilm=RUN --tide hashing=RUN minilm=RUN \\
      --docs docs/lexical.md

Each RUN is an ``experiments.evaluate`` folder of ``experiment=cfsr_table``, ``cfs_table`` or ``tide_table`` (their
pipeline lists carry the ``*bm25en*`` stacks beside the seeds'). ``--docs`` rewrites the part of the page between
the markers ``<!-- lexical-tables -->`` and ``<!-- /lexical-tables -->``; without it the Markdown is printed.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from engram_jax.core.errors import EngramError
from experiments.research.embedder_tables import load_run, paired

BEGIN, END = '<!-- lexical-tables -->', '<!-- /lexical-tables -->'
LABELS = {'hashing': 'hashing', 'minilm': 'MiniLM', 'mpnet': 'mpnet', 'mpnet_fc': 'mpnet (FC only, weights fit on FC)'}
# (claim, metric, a, b) on the seeds' leg and on bm25en: a minus b
CFSR_CLAIMS = (
  ('CFS-R stack - RRF(cos, BM25)', 'rrf_cos_bm25_cfsr', 'rrf_cos_bm25', 'rrf_cos_bm25en_cfsr', 'rrf_cos_bm25en'),
  (
    'MMR stack (tuned) - RRF(cos, BM25)',
    'rrf_cos_bm25_mmr_tuned',
    'rrf_cos_bm25',
    'rrf_cos_bm25en_mmr_tuned',
    'rrf_cos_bm25en',
  ),
  (
    'CFS stack (long) - RRF(cos, BM25)',
    'rrf_cos_bm25_cfs_long',
    'rrf_cos_bm25',
    'rrf_cos_bm25en_cfs_long',
    'rrf_cos_bm25en',
  ),
  ('RRF(cos, BM25) - BM25 alone', 'rrf_cos_bm25', 'bm25', 'rrf_cos_bm25en', 'bm25en'),
  ('CFS-R stack - BM25 alone', 'rrf_cos_bm25_cfsr', 'bm25', 'rrf_cos_bm25en_cfsr', 'bm25en'),
)
CFS_CLAIMS = (
  (
    'CFS stack - its cos2 control (eps 0.30, top-10)',
    'rrf_cos_bm25_cfs',
    'rrf_cos_cos2_bm25_e30',
    'rrf_cos_bm25en_cfs',
    'rrf_cos_cos2_bm25en_e30',
  ),
  (
    'CFS stack - cos2 control (eps 0.50)',
    'rrf_cos_bm25_cfs',
    'rrf_cos_cos2_bm25_e50',
    'rrf_cos_bm25en_cfs',
    'rrf_cos_cos2_bm25en_e50',
  ),
  (
    'CFS stack - cos2 control (eps 1.00)',
    'rrf_cos_bm25_cfs',
    'rrf_cos_cos2_bm25_e100',
    'rrf_cos_bm25en_cfs',
    'rrf_cos_cos2_bm25en_e100',
  ),
  (
    'CFS long stack - its cos2 control (long, eps 0.30)',
    'rrf_cos_bm25_cfs_long',
    'rrf_cos_bm25_cos2_long_e30',
    'rrf_cos_bm25en_cfs_long',
    'rrf_cos_bm25en_cos2_long_e30',
  ),
  (
    'CFS long stack - cos2 control (long, eps 0.50)',
    'rrf_cos_bm25_cfs_long',
    'rrf_cos_bm25_cos2_long_e50',
    'rrf_cos_bm25en_cfs_long',
    'rrf_cos_bm25en_cos2_long_e50',
  ),
  (
    'CFS long stack - cos2 control (long, eps 1.00)',
    'rrf_cos_bm25_cfs_long',
    'rrf_cos_bm25_cos2_long_e100',
    'rrf_cos_bm25en_cfs_long',
    'rrf_cos_bm25en_cos2_long_e100',
  ),
  ('CFS stack - RRF(cos, BM25)', 'rrf_cos_bm25_cfs', 'rrf_cos_bm25', 'rrf_cos_bm25en_cfs', 'rrf_cos_bm25en'),
)
# Tide: (claim, a, b) with the seeds' leg and with bm25en where a side is lexical
TIDE_CLAIMS = (
  ('Tide (dense) - Dense (cosine)', 'tide_dense', 'cosine', 'tide_dense', 'cosine'),
  ('Tide (dense) - BM25', 'tide_dense', 'bm25', 'tide_dense', 'bm25en'),
  ('BM25 + recency - BM25', 'bm25_recency', 'bm25', 'bm25en_recency', 'bm25en'),
)
TIDE_METRICS = {
  'longmemeval_s': ('ndcg_any@10', 'recall_any@5'),
  'fc_sh_6k': ('answer@1',),
  'fc_mh_6k': ('answer@10',),
}  # (the 32K rows: Tide's weight and BM25 + recency's are fit on 32K training questions, so they are not scored there)


def _cell(t: Mapping[str, Any] | None) -> str:
  if t is None:
    return '-'
  star = '' if t['lo'] <= 0 <= t['hi'] else ' **'
  return f'{t["delta"]:+.4f} [{t["lo"]:+.4f}, {t["hi"]:+.4f}]{star}'


def _mean(results: Mapping[str, Any], pipe: str, metric: str) -> str:
  row = results['pipelines'].get(pipe)
  return '-' if row is None or metric not in row else f'{row[metric]:.4f}'


def claims_table(
  runs: Mapping[str, Mapping[str, Any]], claims: Sequence[tuple], metric: str = 'ndcg@10', category: str | None = None
) -> list[str]:
  """One row per claim: per embedder, the paired difference on the seeds' leg and on bm25en (** = the 95% CI
  excludes 0)."""
  head = ['claim (a - b)'] + [f'{LABELS.get(e, e)}: {leg}' for e in runs for leg in ("seeds' bm25", 'bm25en')]
  out = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
  for claim, a, b, a_en, b_en in claims:
    cells = []
    for results in runs.values():
      cells += [
        _cell(paired(results, a, b, metric, category)),
        _cell(paired(results, a_en, b_en, metric, category)),
      ]
    out.append(f'| {claim} | ' + ' | '.join(cells) + ' |')
  return out


def means_table(runs: Mapping[str, Mapping[str, Any]], pairs: Sequence[tuple[str, str]], metric: str) -> list[str]:
  """Each stack's mean on the seeds' leg and on bm25en, per embedder."""
  head = ['stack'] + [f'{LABELS.get(e, e)}: {leg}' for e in runs for leg in ("seeds' bm25", 'bm25en')]
  out = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
  for seed_pipe, en_pipe in pairs:
    cells = [x for r in runs.values() for x in (_mean(r, seed_pipe, metric), _mean(r, en_pipe, metric))]
    out.append(f'| `{seed_pipe}` / `{en_pipe}` | ' + ' | '.join(cells) + ' |')
  return out


def categories(results: Mapping[str, Any]) -> list[str]:
  first = next(iter(results['pipelines'].values()))
  return list(first.get('by_category', {}))


def locomo_section(title: str, runs: Mapping[str, Mapping[str, Any]], claims: Sequence[tuple]) -> list[str]:
  n = {r['n_questions'] for r in runs.values()}
  out = [f'#### {title} (LoCoMo, {"/".join(map(str, sorted(n)))} questions, ndcg@10)', '']
  pairs = list(dict.fromkeys((a, a_en) for _, a, b, a_en, b_en in claims))
  pairs += [p for p in dict.fromkeys((b, b_en) for _, a, b, a_en, b_en in claims) if p not in pairs]
  out += means_table(runs, pairs, 'ndcg@10') + ['']
  out += ['Paired differences, all questions:', ''] + claims_table(runs, claims) + ['']
  for cat in categories(next(iter(runs.values()))):
    out += [f'Category {cat}:', ''] + claims_table(runs, claims, category=cat) + ['']
  return out


def tide_section(runs: Mapping[str, Mapping[str, Any]]) -> list[str]:
  out = ['#### The Tide table (LongMemEval_S pilot, FactConsolidation)', '']
  for ds, metrics in TIDE_METRICS.items():
    blocks = {
      e: {**r['datasets'][ds], 'seed': r['datasets'][ds].get('seed', r.get('seed'))}
      for e, r in runs.items()
      if ds in r.get('datasets', {})
    }
    if not blocks:
      continue
    for metric in metrics:
      n = sorted({b['n_questions'] for b in blocks.values()})
      out += [f'{ds}, {metric} ({"/".join(map(str, n))} questions):', '']
      pairs = [
        ('bm25', 'bm25en'),
        ('bm25_recency', 'bm25en_recency'),
        ('tide_dense', 'tide_dense'),
        ('cosine', 'cosine'),
      ]
      out += means_table(blocks, pairs, metric) + ['']
      out += claims_table(blocks, TIDE_CLAIMS, metric) + ['']
  return out


def page(cfsr: Mapping, cfs: Mapping, tide: Mapping) -> str:
  out = [BEGIN, '']
  out.append(
    'Generated by `python -m experiments.research.lexical_tables` from one run per embedder and table (paired 95% '
    "bootstrap intervals, the runs' seeds; ** marks an interval that excludes 0). Each cell: a minus b on the "
    "seeds' BM25 leg, then with every BM25 leg (and the Tide BM25 base) replaced by `bm25en`."
  )
  out.append('')
  if cfsr:
    out += locomo_section('The CFS-R table', cfsr, CFSR_CLAIMS)
  if cfs:
    out += locomo_section('The CFS table', cfs, CFS_CLAIMS)
  if tide:
    out += tide_section(tide)
  out.append(END)
  return '\n'.join(out) + '\n'


def _runs(specs: Sequence[str] | None, *, datasets: bool = False) -> dict[str, dict[str, Any]]:
  out = {}
  for spec in specs or ():
    if '=' not in spec:
      raise EngramError(f'expected EMBEDDER=RUN_DIR, got {spec!r}')
    label, folder = spec.split('=', 1)
    out[label] = load_run(folder, datasets=datasets)
  return out


def main(argv: Sequence[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--cfsr', nargs='*', help='EMBEDDER=RUN of experiment=cfsr_table')
  ap.add_argument('--cfs', nargs='*', help='EMBEDDER=RUN of experiment=cfs_table')
  ap.add_argument('--tide', nargs='*', help='EMBEDDER=RUN of experiment=tide_table')
  ap.add_argument('--docs', help='the page whose marked part is rewritten')
  args = ap.parse_args(argv)
  try:
    text = page(_runs(args.cfsr), _runs(args.cfs), _runs(args.tide, datasets=True))
    if args.docs:
      path = Path(args.docs)
      old = path.read_text()
      if BEGIN not in old or END not in old:
        raise EngramError(f'{path} has no {BEGIN} ... {END} markers')
      path.write_text(old[: old.index(BEGIN)] + text.rstrip('\n') + old[old.index(END) + len(END) :])
    else:
      print(text)
  except EngramError as e:
    ap.error(str(e))
  return 0


if __name__ == '__main__':
  raise SystemExit(main())
