"""Evidence boundary of a finished run: parent recall, exact-evidence recall, and bounded parent expansion.

Reads ``RUN/results.json`` (each pipeline's retrieved ids per question) and ``RUN/config_resolved.yaml`` (to
reload the same dataset), then prints and writes (``RUN/boundary.md``, ``RUN/boundary.json``) one row per
pipeline and policy: parent recall@k, exact recall@k, exact recall of the expanded evidence packet, mean tokens
spent (and the top-k alone), each with a 95% bootstrap interval, plus the paired gain of expansion.

  python -m experiments.research.boundary_table outputs/boundary/locomo
  python -m experiments.research.boundary_table outputs/boundary/locomo --policy 0:inf 500:2000 1000:4000 inf:inf --tokenizer chars4
  python -m experiments.research.boundary_table --evaluate experiment=boundary 'dataset.loader.conversations=[conv-30]'
  # same-budget control: rank deeper than k (full rankers only: cosine, bm25), score the top 10
  python -m experiments.evaluate experiment=boundary 'pipeline=[cosine,bm25]' eval.k=200 \\
      hydra.run.dir=outputs/boundary/locomo_k200
  python -m experiments.research.boundary_table outputs/boundary/locomo_k200 --k 10

A policy ``P:B`` expands a retrieved item's parent when the parent has at most ``P`` tokens and the packet stays
within ``B`` tokens (``inf`` = unbounded; ``0:inf`` = no expansion); see :mod:`engram_jax.metrics.boundary`.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from hydra.utils import instantiate
from omegaconf import OmegaConf

from engram_jax.metrics import boundary, stats

DEFAULT_POLICIES = ('0:inf', '500:2000', '1000:4000', 'inf:inf')


def parse_policy(text: str) -> tuple[int | None, int | None]:
  """``'500:2000'`` -> ``(500, 2000)``; ``inf`` -> None (unbounded)."""
  try:
    p, b = text.split(':')
    conv = lambda x: None if x.strip().lower() in ('inf', 'none') else int(x)
    return conv(p), conv(b)
  except ValueError as e:
    raise ValueError(f'policy {text!r}: expected MAX_PARENT_TOKENS:BUDGET, e.g. 500:2000 or inf:inf') from e


def _fmt_policy(p: int | None, b: int | None) -> str:
  return f'{"inf" if p is None else p}:{"inf" if b is None else b}'


def load_datasets(run_dir: Path, results: dict[str, Any]) -> dict[str, list]:
  """Reload the run's dataset(s) from its resolved config: ``{dataset name: episodes}``."""
  cfg = OmegaConf.load(run_dir / 'config_resolved.yaml')
  root = cfg.paths.data_root
  if 'datasets' in results:
    return {name: instantiate(cfg.datasets[name].loader, root=root)[0] for name in results['datasets']}
  return {results['dataset']: instantiate(cfg.dataset.loader, root=root)[0]}


def boundary_table(
  results: dict[str, Any],
  episodes: Sequence,
  *,
  policies: Sequence[tuple[int | None, int | None]],
  tokenizer: str = 'whitespace',
  pipelines: Sequence[str] | None = None,
  seed: int = 20261008,
  n_resamples: int = 10_000,
  k: int | None = None,
) -> list[dict[str, Any]]:
  """One row per (pipeline, policy) for one dataset's ``results`` (a results.json dict without ``datasets``).

  ``k`` (default: the run's k) is the retrieved set; a run with a larger k adds the same-budget control (the
  ranked list's longest prefix that fits the tokens the expanded packet spent)."""
  count = boundary.TOKENIZERS[tokenizer]
  by_id = {(ep.id, q.id): (ep, q) for ep in episodes for q in ep.questions}
  indexes = {ep.id: boundary.ParentIndex(ep, count) for ep in episodes}
  k = int(k or results['k'])
  if k > int(results['k']):
    raise ValueError(f"k={k} exceeds the run's k={results['k']}")
  names = list(pipelines) if pipelines else list(results['pipelines'])
  rows = []
  for name in names:
    records = []
    for r in results['per_question']:
      if (r['episode'], r['id']) not in by_id:
        raise KeyError(f'question {r["id"]} of episode {r["episode"]} is not in the reloaded dataset')
      ep, q = by_id[(r['episode'], r['id'])]
      records.append((ep, q, r['retrieved'][name]))
    for p, b in policies:
      s = boundary.boundary_scores(records, k=k, max_parent_tokens=p, budget=b, count_tokens=count, indexes=indexes)
      row: dict[str, Any] = {
        'pipeline': name,
        'policy': _fmt_policy(p, b),
        'max_parent_tokens': p,
        'budget': b,
        'k': k,
        'n': len(records),
        'tokenizer': tokenizer,
      }
      for key, vals in (
        ('parent_recall', s.parent),
        ('exact_recall', s.exact),
        ('expanded_recall', s.expanded),
        ('tokens', s.tokens),
        ('base_tokens', s.base_tokens),
        ('expanded_parents', s.expanded_parents),
      ):
        ci = stats.bootstrap_ci(np.asarray(vals), seed=seed, n_resamples=n_resamples)
        row[key] = [ci.mean, ci.lo, ci.hi]
      row['gain'] = stats.paired_test(
        np.asarray(s.expanded), np.asarray(s.exact), seed=seed, n_resamples=n_resamples
      ).to_dict()
      if s.same_budget is not None:
        ci = stats.bootstrap_ci(np.asarray(s.same_budget), seed=seed, n_resamples=n_resamples)
        row['same_budget_recall'] = [ci.mean, ci.lo, ci.hi]
        row['same_budget_short'] = float(np.mean(s.same_budget_short))
        row['expanded_vs_same_budget'] = stats.paired_test(
          np.asarray(s.expanded), np.asarray(s.same_budget), seed=seed, n_resamples=n_resamples
        ).to_dict()
      rows.append(row)
  return rows


def markdown(rows: Sequence[dict[str, Any]], title: str) -> str:
  def f(v, digits=4):
    return f'{v[0]:.{digits}f} [{v[1]:.{digits}f}, {v[2]:.{digits}f}]'

  lines = [
    f'### {title}',
    '',
    '| pipeline | policy P:B | parent recall@k | exact recall@k | expanded exact recall | '
    'expansion gain (paired) | tokens spent | top-k tokens | parents expanded |',
    '|' + '---|' * 9,
  ]
  for r in rows:
    g = r['gain']
    lines.append(
      f'| {r["pipeline"]} | {r["policy"]} | {f(r["parent_recall"])} | {f(r["exact_recall"])} | '
      f'{f(r["expanded_recall"])} | {g["delta"]:+.4f} [{g["lo"]:+.4f}, {g["hi"]:+.4f}] | '
      f'{f(r["tokens"], 0)} | {r["base_tokens"][0]:.0f} | {r["expanded_parents"][0]:.2f} |'
    )
  ctrl = [r for r in rows if 'same_budget_recall' in r]
  if ctrl:
    lines += [
      '',
      'Same-budget control: exact recall of the longest prefix of the ranked list that fits the tokens '
      'the expanded packet spent (more items instead of whole parents).',
      '',
      '| pipeline | policy P:B | expanded exact recall | same-budget prefix recall | expanded minus prefix '
      '(paired) | list ran out |',
      '|---|---|---|---|---|---|',
    ]
    for r in ctrl:
      g = r['expanded_vs_same_budget']
      lines.append(
        f'| {r["pipeline"]} | {r["policy"]} | {f(r["expanded_recall"])} | {f(r["same_budget_recall"])} | '
        f'{g["delta"]:+.4f} [{g["lo"]:+.4f}, {g["hi"]:+.4f}] | {r["same_budget_short"]:.3f} |'
      )
  lines += [
    '',
    'Policy P:B: a retrieved item brings its whole parent when the parent has <= P tokens and the packet '
    'stays <= B tokens (inf = unbounded; 0:inf = no expansion). Means with 95% bootstrap intervals.',
  ]
  return '\n'.join(lines) + '\n'


def run_boundary(
  run_dir: Path,
  *,
  policies: Sequence[str] = DEFAULT_POLICIES,
  tokenizer: str = 'whitespace',
  pipelines: Sequence[str] | None = None,
  n_resamples: int = 10_000,
  out_dir: Path | None = None,
  k: int | None = None,
) -> dict[str, list[dict[str, Any]]]:
  """Boundary rows for every dataset of a finished run; writes ``boundary.md`` / ``boundary.json``."""
  run_dir = Path(run_dir)
  results = json.loads((run_dir / 'results.json').read_text())
  parsed = [parse_policy(p) for p in policies]
  loaded = load_datasets(run_dir, results)
  per_ds = results['datasets'] if 'datasets' in results else {results['dataset']: results}
  out, text = {}, []
  for name, res in per_ds.items():
    rows = boundary_table(
      res,
      loaded[name],
      policies=parsed,
      tokenizer=tokenizer,
      pipelines=pipelines,
      seed=int(res.get('seed', 20261008)),
      n_resamples=n_resamples,
      k=k,
    )
    out[name] = rows
    text.append(
      markdown(
        rows, f'{name}: evidence boundary, {res["n_questions"]} questions, k={k or res["k"]}, tokens = {tokenizer}'
      )
    )
  out_dir = Path(out_dir or run_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  (out_dir / 'boundary.md').write_text('\n'.join(text))
  (out_dir / 'boundary.json').write_text(json.dumps(out, indent=1))
  print('\n'.join(text))
  return out


def _evaluate_first(overrides: Sequence[str], out_dir: Path) -> Path:
  """Run ``experiments.evaluate`` with Hydra ``overrides`` into ``out_dir`` and return it."""
  from hydra import compose, initialize_config_dir

  from experiments import evaluate

  with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[2] / 'conf'), version_base='1.3'):
    cfg = compose(config_name='config', overrides=list(overrides))
  evaluate.run(cfg, out_dir)
  return out_dir


def main(argv: Sequence[str] | None = None) -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument('run', nargs='?', type=Path, help='a finished run folder (results.json + config_resolved.yaml)')
  ap.add_argument(
    '--evaluate',
    nargs='+',
    metavar='OVERRIDE',
    help='run experiments.evaluate with these Hydra overrides first (into --out, or outputs/boundary)',
  )
  ap.add_argument('--policy', nargs='+', default=list(DEFAULT_POLICIES), help='MAX_PARENT_TOKENS:BUDGET ...')
  ap.add_argument('--tokenizer', default='whitespace', choices=sorted(boundary.TOKENIZERS))
  ap.add_argument('--pipelines', default=None, help='comma-separated subset (default: all in the run)')
  ap.add_argument(
    '--k',
    type=int,
    default=None,
    help="retrieved set size (default: the run's k; a smaller k than the run's adds the same-budget control)",
  )
  ap.add_argument('--n-resamples', type=int, default=10_000)
  ap.add_argument('--out', type=Path, default=None, help='where to write boundary.md/json (default: the run folder)')
  args = ap.parse_args(argv)
  run_dir = args.run
  if args.evaluate:
    run_dir = _evaluate_first(args.evaluate, args.out or run_dir or Path('outputs/boundary'))
  if run_dir is None:
    ap.error('give a run folder or --evaluate OVERRIDES')
  run_boundary(
    run_dir,
    policies=args.policy,
    tokenizer=args.tokenizer,
    pipelines=args.pipelines.split(',') if args.pipelines else None,
    n_resamples=args.n_resamples,
    out_dir=args.out,
    k=args.k,
  )


if __name__ == '__main__':
  main()
