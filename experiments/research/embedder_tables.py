"""The seeds' tables across embedders, generated from finished run folders (issue 44 item 3).

    python -m experiments.research.embedder_tables hashing=RUN_H MiniLM=RUN_M mpnet=RUN_P \\
      --cfs hashing=CFS_H MiniLM=CFS_M mpnet=CFS_P --tide hashing=TIDE_H MiniLM=TIDE_M --doc docs/embedders.md

Each ``LABEL=RUN`` is the run folder of ``python -m experiments.evaluate experiment=... embedder=...`` (whole: its
``run_complete.json`` is checked first): the positional ones of ``experiment=cfsr_table``, ``--cfs`` ones of
``experiment=cfs_table``, ``--tide`` ones of ``experiment=tide_table`` (``--tide-fc``: of its FactConsolidation-only
variant, :data:`FC_ONLY`). Written, per table: the metrics per pipeline (rows) and embedder (columns) with the
published rows beside them (the runs' ``reference``, checked to occur in the seed text under the seeds folder when it
is there), a metric per category, and the paired differences the seed text reports, overall and per category: the
run's own paired test where it made one (``results.json``), else the same test computed here from the per-question
scores with the run's seed. ``--doc`` replaces each table's block between its markers (``<!-- NAME: generated -->``
.. ``<!-- /NAME -->``; NAME ``embedders``, ``embedders-cfs``, ``embedders-tide``, ``embedders-tide-fc``) in that
page; ``--readme`` replaces the ``embedders-headline`` block there with a summary table (:func:`headline`).
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from engram_jax.core import runfolder
from engram_jax.core.errors import EngramError

STACK = 'rrf_cos_bm25_cfsr'
COMPARISONS = ('rrf_cos_bm25', 'rrf_cos_bm25_mmr_tuned', 'rrf_cos_bm25_cfs_long')  # the CFS-R post's
METRICS = ('ndcg@10', 'recall@10')
SEED_MARK = 'CFS-R'  # the CFS-R post is the seed text that names it in its first lines (the CFS post is inside it)
CFS = 'rrf_cos_bm25_cfs'
CFS_LONG = 'rrf_cos_bm25_cfs_long'
# the CFS post's comparisons (a minus b) and what it reports for them with text-embedding-3-small, as printed there
ABOVE = 'above, CI excluding zero'
CFS_COMPARISONS = (
  (CFS, 'rrf_cos_bm25', {'ndcg@10': '+1.15 pp', 'recall@10': '+1.79 pp'}),
  (CFS, 'mem0', {'ndcg@10': '+4.08 pp', 'recall@10': '+5.43 pp'}),
  (CFS, 'rrf_cos_cos2_bm25_e30', {'recall@10': '+1.08 pp (over "the perturbed-cosine control")'}),
  (CFS, 'rrf_cos_cos2_bm25_e50', {}),
  (CFS, 'rrf_cos_cos2_bm25_e100', {}),
  (CFS_LONG, 'rrf_cos_bm25_cos2_long_e30', {'ndcg@10': ABOVE, 'recall@10': ABOVE}),
  (CFS_LONG, 'rrf_cos_bm25_cos2_long_e50', {'ndcg@10': ABOVE, 'recall@10': ABOVE}),
  (CFS_LONG, 'rrf_cos_bm25_cos2_long_e100', {'ndcg@10': ABOVE, 'recall@10': ABOVE}),
)
TIDE_MARK = 'Tide'  # the Tide page: its first line
# the Tide page's datasets, in its order, with the metrics shown and compared for each (its headline metric first)
TIDE_DATASETS = {
  'longmemeval_s': ('ndcg_any@10', 'recall_any@5'),
  'fc_sh_6k': ('answer@1', 'answer@10'),
  'fc_mh_6k': ('answer@10', 'answer@1'),
  'fc_sh_32k': ('answer@1', 'answer@10'),
  'fc_mh_32k': ('answer@10', 'answer@1'),
}
TIDE_COMPARISONS = (('tide_dense', 'cosine'), ('tide_dense_lme', 'cosine'), ('bm25_recency', 'bm25'))
HEADLINE_ROWS = ('cosine', 'rrf_cos_bm25', 'rrf_cos_bm25_mmr_tuned', CFS, CFS_LONG, STACK)


def load_run(folder: str | Path, *, datasets: bool = False) -> dict[str, Any]:
  """``results.json`` of a whole evaluate run folder: of one dataset, or (``datasets``) of several (refused in one
  line otherwise)."""
  folder = Path(folder)
  runfolder.check(folder, ['results.json'])
  results = json.loads((folder / 'results.json').read_text())
  if datasets and 'datasets' not in results:
    raise EngramError(f'{folder}: not a several-dataset evaluate run (results.json has no datasets)')
  if not datasets and 'pipelines' not in results:
    raise EngramError(f'{folder}: not a one-dataset evaluate run (results.json has no pipelines)')
  return results


def seed_text(
  seeds: Path | None, mark: str = SEED_MARK, needle: str = 'rrf(cos, BM25, CFS-R'
) -> tuple[str, str] | None:
  """(file name, text) of the seed text that names ``mark`` in its first lines and holds ``needle``, if found."""
  if seeds is None or not seeds.is_dir():
    return None
  for path in sorted(seeds.glob('*.txt')):
    text = path.read_text(encoding='utf-8', errors='replace')
    if mark in text[:2000] and needle in text:
      return path.name, text
  return None


def check_reference(
  reference: Mapping[str, Mapping[str, float]], seed: tuple[str, str] | None, digits: Sequence[int] = (4,)
) -> list[str]:
  """The published numbers that do not occur in the seed text (as printed there: with one of ``digits`` decimals;
  the Tide page prints 0.940 and 0.40)."""
  if seed is None:
    return []
  found = lambda v: any(f'{v:.{d}f}' in seed[1] for d in digits)
  return [f'{pipe} {m} {v:.4f}' for pipe, row in reference.items() for m, v in row.items() if not found(v)]


def check_claims(claims: Sequence[str], seed: tuple[str, str] | None) -> list[str]:
  """The numbers of ``claims`` (e.g. '+1.15 pp') that do not occur in the seed text."""
  if seed is None:
    return []
  nums = [n for c in claims for n in re.findall(r'[+-]\d+\.\d+', c)]
  return [n for n in nums if n not in seed[1]]


def per_question(results: Mapping[str, Any], pipe: str, metric: str) -> np.ndarray:
  """``[Q]`` float64 scores of ``pipe`` on ``metric`` in a run's results.json, in its question order."""
  return np.asarray([q['scores'][pipe][metric] for q in results['per_question']], np.float64)


def category_mask(results: Mapping[str, Any], label: str) -> np.ndarray:
  """``[Q]`` bool: the questions of the category ``label`` (a ``by_category`` key: ``name (raw)`` or ``raw``)."""
  cats = [str(q['category']) for q in results['per_question']]
  return np.asarray([label == c or label.endswith(f' ({c})') for c in cats], bool)


def paired(
  results: Mapping[str, Any], a: str, b: str, metric: str = 'ndcg@10', category: str | None = None
) -> dict[str, Any] | None:
  """``a`` minus ``b`` on ``metric`` (over one ``category``'s questions when given): the run's own paired test when
  it made one, else the same test from the per-question scores (bootstrap CI, sign-flip p, the run's seed); None
  when the run lacks either pipeline."""
  from engram_jax.metrics import paired_test

  pipes = results['pipelines']
  if a not in pipes or b not in pipes or metric not in pipes[a] or metric not in pipes[b]:
    return None
  own = pipes[a].get('paired', {}).get(f'vs {b}', {}).get(metric) if category is None else None
  if own is not None:
    return {**own, 'source': 'run'}
  x, y = per_question(results, a, metric), per_question(results, b, metric)
  if category is not None:
    sel = category_mask(results, category)
    x, y = x[sel], y[sel]
  if not len(x):
    return None
  r = paired_test(x, y, seed=results['seed'])
  return {'delta': r.delta, 'lo': r.lo, 'hi': r.hi, 'p': r.p, 'n': len(x), 'source': 'here'}


def stack_vs(results: Mapping[str, Any], other: str, metric: str = 'ndcg@10') -> dict[str, float] | None:
  """The CFS-R stack minus ``other`` (:func:`paired`)."""
  return paired(results, STACK, other, metric)


def _p(p: float) -> str:
  return f'{p:.2g}' if p >= 0.001 else '<0.001'


def _diff(t: Mapping[str, Any] | None, digits: int = 4, p: bool = True) -> str:
  if t is None:
    return '-'
  d = digits
  cell = f'{t["delta"]:+.{d}f} [{t["lo"]:+.{d}f}, {t["hi"]:+.{d}f}]' + (f' p {_p(t["p"])}' if p else '')
  if p and t.get('mcnemar_p') is not None:  # 0/1 metrics: the run's McNemar test beside the sign-flip one
    cell += f', McNemar {_p(t["mcnemar_p"])}'
  return cell + (' *' if t['source'] == 'here' else '')


def _one_n(runs: Mapping[str, Mapping[str, Any]]) -> int:
  n = {r['n_questions'] for r in runs.values()}
  if len(n) != 1:
    raise EngramError(f'the runs scored different numbers of questions ({sorted(n)}): not one table')
  return n.pop()


def metric_tables(runs: Mapping[str, Mapping[str, Any]], metrics: Sequence[str], published: str) -> list[str]:
  """One table per metric: pipelines (rows) by embedder (columns), mean [95% CI], the published number beside."""
  labels = list(runs)
  pipes = list(dict.fromkeys(p for r in runs.values() for p in r['pipelines']))
  reference = runs[labels[0]].get('reference') or {}
  out = []
  for metric in metrics:
    head = [f'{metric}: pipeline', *labels, f'published ({published})']
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
  return out


def category_table(runs: Mapping[str, Mapping[str, Any]], metric: str = 'ndcg@10') -> list[str]:
  """``metric`` per category: pipelines (rows) by category (columns), each cell the embedders' values."""
  labels = list(runs)
  first = runs[labels[0]]
  pipes = list(dict.fromkeys(p for r in runs.values() for p in r['pipelines']))
  cats = list(dict.fromkeys(c for r in runs.values() for p in r['pipelines'].values() for c in p['by_category']))
  count = lambda cat: (first['pipelines'][pipes[0]]['by_category'].get(cat) or {}).get('n', '?')
  head = [f'{metric} by category: pipeline', *(f'{cat} n={count(cat)}' for cat in cats)]
  out = [f'{metric} by category, each cell {" / ".join(labels)}:', '']
  out += ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
  for pipe in pipes:
    cells = []
    for cat in cats:
      vals = [runs[label]['pipelines'].get(pipe, {}).get('by_category', {}).get(cat) for label in labels]
      cells.append(' / '.join('-' if v is None or metric not in v else f'{v[metric]:.3f}' for v in vals))
    out.append(f'| `{pipe}` | ' + ' | '.join(cells) + ' |')
  return out + ['']


def category_diffs(
  runs: Mapping[str, Mapping[str, Any]], pairs: Sequence[tuple[str, str]], metric: str = 'ndcg@10'
) -> list[str]:
  """Per category, ``a`` minus ``b`` on ``metric`` for each pair: rows (pair, category) by embedder (columns),
  computed here from the per-question scores (paired bootstrap 95% CI)."""
  labels = list(runs)
  first = next(iter(runs.values()))
  cats = list(next(iter(first['pipelines'].values()))['by_category'])
  head = [f'{metric}: a minus b, by category', *labels]
  out = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
  for a, b in pairs:
    for cat in cats:
      cells = []
      for label in labels:
        t = paired(runs[label], a, b, metric, category=cat)
        cells.append('-' if t is None else _diff({**t, 'source': 'run'}, 3, p=False) + _star(t))
      out.append(f'| `{a}` - `{b}`, {cat} | ' + ' | '.join(cells) + ' |')
  return out + ['']


def _star(t: Mapping[str, Any]) -> str:
  return ' (+)' if t['lo'] > 0 else ' (-)' if t['hi'] < 0 else ''


CAT_NOTE = (
  "Per category: paired bootstrap 95% CIs over that category's questions, computed here from the per-question scores "
  "with the run's seed; (+) / (-): the interval is above / below zero."
)


def _intro(runs: Mapping[str, Mapping[str, Any]], experiment: str, ci: str, published: str) -> list[str]:
  """A LoCoMo table's heading line, its metric tables and its by-category table (the CFS-R and CFS tables)."""
  n = _one_n(runs)
  out = [
    f'**LoCoMo, {n} questions, k = 10, `experiment={experiment}`**, one run per embedder ({ci}); published: '
    f'{published}.',
    '',
  ]
  return out + metric_tables(runs, METRICS, 'text-embedding-3-small') + category_table(runs)


def tables(runs: Mapping[str, Mapping[str, Any]], *, seed: tuple[str, str] | None = None) -> str:
  """The Markdown of the cross-embedder CFS-R tables for ``{label: results}`` (in the given order)."""
  labels = list(runs)
  src = f'the CFS-R post, `{seed[0]}` of the seeds' if seed else 'the CFS-R post (as the runs record it)'
  out = _intro(runs, 'cfsr_table', '95% bootstrap CIs', f'{src}, text-embedding-3-small, another embedder and setup')
  head = ['ndcg@10: CFS-R stack minus', *labels]
  out += ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
  for other in COMPARISONS:
    out.append(f'| `{other}` | ' + ' | '.join(_diff(stack_vs(runs[label], other)) for label in labels) + ' |')
  out += [
    '',
    "Paired bootstrap 95% CIs and sign-flip p over the same questions; against `rrf_cos_bm25` the run's own test "
    "(`results.json`), * computed here from the per-question scores with the run's seed. The CFS-R post reports, "
    'with text-embedding-3-small: +1.17 pp [+0.66, +1.69] against tuned MMR and +0.85 pp [+0.33, +1.35] against '
    'CFS-long (+2.51 pp against plain RRF, 0.5447 - 0.5196, without a CI).',
    '',
  ]
  out += category_diffs(runs, [(STACK, other) for other in COMPARISONS])
  out.append(CAT_NOTE)
  return '\n'.join(out) + '\n'


def cfs_tables(runs: Mapping[str, Mapping[str, Any]], *, seed: tuple[str, str] | None = None) -> str:
  """The Markdown of the cross-embedder CFS tables (``experiment=cfs_table`` runs) for ``{label: results}``."""
  labels = list(runs)
  src = f'the CFS post (inside `{seed[0]}` of the seeds)' if seed else 'the CFS post (as the runs record it)'
  out = _intro(
    runs, 'cfs_table', '95% bootstrap CIs; the cos2 rows are means over 5 noise seeds', f'{src}, text-embedding-3-small'
  )
  for metric in METRICS:
    head = [f'{metric}: a minus b', *labels, 'the CFS post (text-embedding-3-small)']
    out += ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for a, b, claim in CFS_COMPARISONS:
      shown = claim.get(metric, '')
      cells = [_diff(paired(runs[label], a, b, metric)) for label in labels]
      out.append(f'| `{a}` - `{b}` | ' + ' | '.join(cells) + f' | {shown or "-"} |')
    out.append('')
  out += [
    "Paired bootstrap 95% CIs and sign-flip p over the same questions; against `rrf_cos_bm25` the run's own test "
    "(`results.json`), * computed here from the per-question scores with the run's seed. The post's pile-up subset "
    "(single-hop questions with a redundant cosine pair) is in each run's `results.md`, not here.",
    '',
  ]
  pairs = [
    (CFS, 'rrf_cos_bm25'),
    (CFS, 'mem0'),
    (CFS, 'rrf_cos_cos2_bm25_e30'),
    (CFS_LONG, 'rrf_cos_bm25_cos2_long_e30'),
  ]
  out += category_diffs(runs, pairs)
  out.append(CAT_NOTE)
  return '\n'.join(out) + '\n'


def _tide_block(results: Mapping[str, Any], ds: str) -> dict[str, Any] | None:
  block = results['datasets'].get(ds)
  return None if block is None else {**block, 'seed': block.get('seed', results.get('seed'))}


FC_ONLY = (
  "FactConsolidation only (`'~datasets.longmemeval_s'`), Tide's weight fit on FactConsolidation's 32K training "
  "questions only (`'pipeline.tide_dense.tune.train=[fc_sh_train,fc_mh_train]'`; the Tide page's row also fits it on "
  'LongMemEval_S training questions)'
)


def tide_tables(
  runs: Mapping[str, Mapping[str, Any]], *, seed: tuple[str, str] | None = None, variant: str | None = None
) -> str:
  """The Markdown of the cross-embedder Tide tables (``experiment=tide_table`` runs, or a ``variant`` of it, said
  in the heading) for ``{label: results}``; an embedder whose run lacks a dataset shows '-' there."""
  labels = list(runs)
  reference = next(iter(runs.values())).get('reference') or {}
  src = f'the Tide page, `{seed[0]}` of the seeds' if seed else 'the Tide page (as the runs record it)'
  what = (
    f'`experiment=tide_table`, {variant}'
    if variant
    else 'LongMemEval_S pilot (session level) and FactConsolidation SH/MH at 6K and 32K, `experiment=tide_table`'
  )
  out = [
    f'**{what}**, k = 10, one run per embedder (95% intervals: bootstrap, Wilson for 0/1 metrics); '
    f'published: {src}, bge-small (LongMemEval: 83 scored questions), another embedder.',
    '',
  ]
  shown = [ds for ds in TIDE_DATASETS if any(ds in r['datasets'] for r in runs.values())]
  for ds in shown:
    blocks = {label: _tide_block(runs[label], ds) for label in labels}
    have = {label: b for label, b in blocks.items() if b is not None}
    n = sorted({b['n_questions'] for b in have.values()})
    pipes = list(dict.fromkeys(p for b in have.values() for p in b['pipelines']))
    for metric in TIDE_DATASETS[ds]:
      head = [f'{ds} {metric}: pipeline', *labels, 'published (bge-small)']
      out += [f'**{ds}**, {"/".join(map(str, n))} questions:' if metric == TIDE_DATASETS[ds][0] else '', '']
      out += ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
      for pipe in pipes:
        cells = []
        for label in labels:
          row = (blocks[label] or {}).get('pipelines', {}).get(pipe)
          cells.append(
            '-'
            if row is None or metric not in row
            else f'{row[metric]:.3f} [{row["ci95"][metric][0]:.3f}, {row["ci95"][metric][1]:.3f}]'
          )
        pub = reference.get(pipe, {}).get(f'{ds} {metric}')
        out.append(f'| `{pipe}` | ' + ' | '.join(cells) + f' | {"-" if pub is None else f"{pub:.3f}"} |')
      out.append('')
    out = [line for i, line in enumerate(out) if line or i == 0 or out[i - 1]]  # no double blank lines
    rows = []
    for a, b in TIDE_COMPARISONS:
      for metric in TIDE_DATASETS[ds]:
        cells = [_diff(None if blocks[label] is None else paired(blocks[label], a, b, metric)) for label in labels]
        if set(cells) != {'-'}:
          rows.append(f'| `{a}` - `{b}`, {metric} | ' + ' | '.join(cells) + ' |')
    if rows:  # a comparison whose rows no run scored (e.g. a fitted row on the 32K sets it is fit on) is left out
      head = [f'{ds}: a minus b', *labels]
      out += ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head), *rows, '']
  out += [
    "Paired differences: bootstrap 95% CIs and sign-flip p (and McNemar's p for 0/1 metrics) over the same questions, "
    "the run's own test (`results.json`, against `cosine` and `bm25`); rows fit on the 32K questions are not scored there (absent). The Tide page's "
    'hypothesis: Tide above Dense on FC-SH with a paired interval above zero, much less on FC-MH.',
    '',
  ]
  tuned = list(dict.fromkeys(p for r in runs.values() for p in (r.get('fitted') or {})))
  if tuned:
    head = ['weight chosen on the training questions', *labels]
    out += ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for pipe in tuned:
      cells = [str((runs[label].get('fitted') or {}).get(pipe, {}).get('chosen', '-')) for label in labels]
      sets = next(r['fitted'][pipe]['train_sets'] for r in runs.values() if pipe in (r.get('fitted') or {}))
      out.append(f'| `{pipe}` (on {", ".join(sets)}) | ' + ' | '.join(f'`{c}`' for c in cells) + ' |')
    out.append('')
  lme = {label: _tide_block(r, 'longmemeval_s') for label, r in runs.items() if 'longmemeval_s' in r['datasets']}
  if lme:
    out += ['LongMemEval_S by question type (the Tide page reports it so):', '']
    out += category_table(lme, 'ndcg_any@10')
    out += category_diffs(lme, [('tide_dense', 'cosine'), ('tide_dense_lme', 'cosine')], 'ndcg_any@10')
    out.append(CAT_NOTE)
  return '\n'.join(out) + '\n'


def headline(
  cfsr: Mapping[str, Mapping[str, Any]],
  cfs: Mapping[str, Mapping[str, Any]] | None = None,
  fitted: Mapping[str, Mapping[str, Any]] | None = None,
) -> str:
  """The README's cross-embedder summary: LoCoMo ndcg@10 of the seeds' rows per embedder (CFS-R table runs, the CFS
  stack from the CFS table runs), the published column, and the fitted stack's ledger row per embedder."""
  labels = list(cfsr)
  ref = {
    **((next(iter(cfs.values())).get('reference') or {}) if cfs else {}),
    **(next(iter(cfsr.values())).get('reference') or {}),
  }
  head = ['LoCoMo ndcg@10', *labels, 'published (text-embedding-3-small)']
  out = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
  for pipe in HEADLINE_ROWS:
    cells = []
    for label in labels:
      row = cfsr[label]['pipelines'].get(pipe) or ((cfs or {}).get(label) or {}).get('pipelines', {}).get(pipe)
      cells.append('-' if row is None else f'{row["ndcg@10"]:.3f}')
    pub = ref.get(pipe, {}).get('ndcg@10')
    if set(cells) != {'-'}:
      out.append(f'| `{pipe}` | ' + ' | '.join(cells) + f' | {"-" if pub is None else f"{pub:.4f}"} |')
  if fitted:
    cells = []
    for label in labels:
      row = fitted.get(label)
      val = None if row is None else row['summary'].get(f'{STACK} (fitted, out of fold)', {}).get('ndcg@10')
      cells.append('-' if val is None else f'{val:.3f} (`{row["protocol"]}`)')
    out.append(f'| `{STACK}` fitted, 8 knobs, out of fold | ' + ' | '.join(cells) + ' | - |')
  return '\n'.join(out) + '\n'


def with_block(text: str, name: str, block: str) -> str:
  """``text`` with the lines between ``<!-- NAME: generated ... -->`` and ``<!-- /NAME -->`` replaced by ``block``.

  Example:
    >>> with_block('a\\n<!-- t: generated -->\\nold\\n<!-- /t -->\\nb', 't', 'new\\n')
    'a\\n<!-- t: generated -->\\nnew\\n<!-- /t -->\\nb'
  """
  start = re.search(rf'^<!-- {re.escape(name)}: generated[^\n]*-->\n', text, re.M)
  end = text.find(f'<!-- /{name} -->')
  if start is None or end < start.end():
    raise EngramError(f'no <!-- {name}: generated --> ... <!-- /{name} --> block to replace')
  return text[: start.end()] + block + text[end:]


def _runs(items: Sequence[str], ap: argparse.ArgumentParser, *, datasets: bool = False) -> dict[str, dict[str, Any]]:
  runs = {}
  for item in items or ():
    label, sep, folder = item.partition('=')
    if not sep or not label or not folder:
      ap.error(f'expected LABEL=RUN, got {item!r}')
    runs[label] = load_run(folder, datasets=datasets)
  return runs


def _fitted(items: Sequence[str], ap: argparse.ArgumentParser) -> dict[str, dict[str, Any]]:
  """``LABEL=PROTOCOL`` -> that protocol's (unforced) ledger row."""
  from experiments.lib import protocol

  rows = {r['protocol']: r for r in protocol.read_jsonl(protocol.LEDGER) if not r.get('forced')}
  out = {}
  for item in items or ():
    label, sep, name = item.partition('=')
    if not sep or name not in rows:
      ap.error(f'expected LABEL=PROTOCOL of an unforced row of {protocol.LEDGER.name}, got {item!r}')
    out[label] = rows[name]
  return out


def main(argv: Sequence[str] | None = None) -> str:
  ap = argparse.ArgumentParser(prog='python -m experiments.research.embedder_tables', description=__doc__)
  ap.add_argument('runs', nargs='*', metavar='LABEL=RUN', help='an embedder label and its cfsr_table run folder')
  ap.add_argument('--cfs', nargs='+', metavar='LABEL=RUN', help='cfs_table run folders')
  ap.add_argument('--tide', nargs='+', metavar='LABEL=RUN', help='tide_table run folders')
  ap.add_argument('--tide-fc', nargs='+', metavar='LABEL=RUN', help='tide_table runs on FC only (FC_ONLY)')
  ap.add_argument('--fitted', nargs='+', metavar='LABEL=PROTOCOL', help='the fitted stack per embedder (ledger)')
  ap.add_argument('--seeds', default=None, help='the seed texts (default: ../shared/seeds beside the checkout)')
  ap.add_argument('--out', default=None, help='write the Markdown here (else print it)')
  ap.add_argument('--doc', default=None, help="replace the tables' marked blocks in this page")
  ap.add_argument('--readme', default=None, help='replace the embedders-headline block in this file')
  args = ap.parse_args(argv)
  cfsr, cfs, tide = _runs(args.runs, ap), _runs(args.cfs, ap), _runs(args.tide, ap, datasets=True)
  tide_fc = _runs(args.tide_fc, ap, datasets=True)
  if not (cfsr or cfs or tide or tide_fc):
    ap.error('give run folders: LABEL=RUN (cfsr_table), --cfs or --tide')
  seeds = Path(args.seeds) if args.seeds else Path(__file__).resolve().parents[3] / 'shared' / 'seeds'
  blocks = {}
  if cfsr:
    seed = seed_text(seeds)
    missing = check_reference(next(iter(cfsr.values())).get('reference') or {}, seed)
    if missing:
      raise EngramError(f'published numbers not found in the CFS-R post {seed[0]}: {missing}')
    blocks['embedders'] = tables(cfsr, seed=seed)
  if cfs:
    seed = seed_text(seeds, needle='rrf(cosine, BM25, CFS)')
    missing = check_reference(next(iter(cfs.values())).get('reference') or {}, seed)
    missing += check_claims([c for _, _, claims in CFS_COMPARISONS for c in claims.values()], seed)
    if missing:
      raise EngramError(f'published numbers not found in the CFS post {seed[0]}: {missing}')
    blocks['embedders-cfs'] = cfs_tables(cfs, seed=seed)
  if tide:
    seed = seed_text(seeds, mark=TIDE_MARK, needle='FactConsolidation')
    ref = next(iter(tide.values())).get('reference') or {}
    missing = check_reference(ref, seed, digits=(3, 2))
    if missing:
      raise EngramError(f'published numbers not found in the Tide page {seed[0]}: {missing}')
    blocks['embedders-tide'] = tide_tables(tide, seed=seed)
  if tide_fc:
    seed = seed_text(seeds, mark=TIDE_MARK, needle='FactConsolidation')
    blocks['embedders-tide-fc'] = tide_tables(tide_fc, seed=seed, variant=FC_ONLY)
  text = '\n'.join(blocks.values())
  if args.doc:
    page = Path(args.doc).read_text()
    for name, block in blocks.items():
      page = with_block(page, name, block)
    Path(args.doc).write_text(page)
  if args.readme:
    if not cfsr:
      ap.error('--readme needs the cfsr_table runs')
    readme = Path(args.readme).read_text()
    Path(args.readme).write_text(
      with_block(readme, 'embedders-headline', headline(cfsr, cfs, _fitted(args.fitted, ap)))
    )
  if args.out:
    Path(args.out).write_text(text)
  elif not (args.doc or args.readme):
    print(text, end='')
  return text


if __name__ == '__main__':
  main()
