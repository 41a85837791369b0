"""A lexical protocol (``conf/lexical/<name>.yaml``): choose the default lexical leg on selection questions by a grid
fixed in advance, confirm it once on questions the choice never read, and append the scoring to the ledger
``conf/lexical/scored.jsonl``.

  python -m experiments.research.lexical_default lexical_default

The protocol file says what is compared (its comment is the protocol's prose): the grid (analyzer x BM25 form x k1 x
b), the selection sets (LoCoMo conversations drawn with the seed, LongMemEval_S's pilot) and the criterion (the mean
of the two datasets' metrics), the confirmation sets (LoCoMo's other conversations, LongMemEval_S's confirm part), the
rows the winner is paired with, and the adoption rule. As for the fit protocols (:mod:`experiments.lib.protocol`):
the file must be committed unmodified and the tree clean, a protocol is scored once, and the row records the file's
SHA-256, the git commit, the package versions and a fingerprint of the data read; ``--force`` runs anyway, marked as
forced with every reason (into a scratch ``--ledger`` unless it names the tracked one). BM25 reads no vector, so
nothing is embedded (:func:`experiments.lib.common.no_embedder`).

Outputs (``--out``, default ``outputs/protocols/<name>``): ``selection.json`` (every grid point's selection scores),
``results.json`` (the winner, the adoption, each confirmation set's summary with paired tests) and ``results.md``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import OmegaConf

from engram_jax.core.batch import episode_arrays
from engram_jax.core.errors import EngramError
from engram_jax.data import splits
from engram_jax.eval import evaluation, grid, pipeline
from engram_jax.metrics import report
from experiments.lib import common, protocol

ROOT = Path(__file__).resolve().parents[2]
LEXICAL_DIR = ROOT / 'conf' / 'lexical'
LEDGER = LEXICAL_DIR / 'scored.jsonl'
N_RESAMPLES = 10_000


def rel(path: Path) -> str:
  """``path`` relative to the repository when inside it (for messages), else as given."""
  path = Path(path).resolve()
  return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def load(overrides: Sequence[str]):
  """``(episodes, dataset config)`` of ``conf/config.yaml`` composed with ``overrides``."""
  from hydra import compose, initialize_config_dir

  with initialize_config_dir(config_dir=str(ROOT / 'conf'), version_base='1.3'):
    cfg = compose(config_name='config', overrides=list(overrides))
  episodes, _ = common.load_dataset(cfg, cfg.dataset)
  return episodes, cfg.dataset


def lexical_pipe(tokenizer: str, form: str, delta: float) -> pipeline.Pipeline:
  return pipeline.make_pipeline(
    legs={'bm25': {'op': 'bm25', 'tokenizer': tokenizer, 'form': form, 'delta': float(delta)}},
    name=f'bm25[{tokenizer},{form}]',
  )


def grid_means(
  episodes, ds, spec: Mapping[str, Any], metric: str, *, k: int, seed: int
) -> dict[tuple[str, str, float, float], float]:
  """Every grid point's mean ``metric`` over ``episodes``' questions: ``{(tokenizer, form, k1, b): mean}``."""
  g = spec['grid']
  vectors = evaluation.embed_episodes(episodes, common.no_embedder())
  out = {}
  for tokenizer in g['tokenizer']:
    arrays = [episode_arrays(ep, d, q, tokenizers=[tokenizer]) for ep, (d, q) in zip(episodes, vectors)]
    for form in g['form']:
      res = grid.evaluate_grid(
        episodes,
        vectors,
        lexical_pipe(tokenizer, form, spec['delta']),
        {'legs.bm25.k1': list(g['k1']), 'legs.bm25.b': list(g['b'])},
        k=k,
        metrics=[metric],
        seed=seed,
        episode_metrics=common.dataset_metrics(ds),
        arrays=arrays,
      )
      means = np.asarray(res.scores[metric]).mean(axis=1)
      for p, mean in enumerate(means):
        point = res.point(p)
        out[(tokenizer, form, float(point['legs.bm25.k1']), float(point['legs.bm25.b']))] = float(mean)
  return out


def choose(selection: Mapping[str, Mapping[tuple, float]], order: Sequence[tuple]) -> tuple[tuple, list[dict]]:
  """The grid point of the highest mean over datasets (ties to the earlier point of ``order``) and every point's
  row (the selection table)."""
  rows = []
  for point in order:
    per = {name: scores[point] for name, scores in selection.items()}
    rows.append({'point': list(point), **per, 'criterion': float(np.mean(list(per.values())))})
  best = max(range(len(rows)), key=lambda i: (rows[i]['criterion'], -i))
  return order[best], rows


def confirm(
  episodes, ds, pipes: Mapping[str, pipeline.Pipeline], metrics: Sequence[str], *, k: int, seed: int
) -> dict[str, Any]:
  """The pipelines scored on ``episodes`` with the winner paired against each other row."""
  result = evaluation.evaluate(
    episodes,
    evaluation.embed_episodes(episodes, common.no_embedder()),
    dict(pipes),
    k=k,
    metrics=list(metrics),
    seed=seed,
    progress=False,
    episode_metrics=common.dataset_metrics(ds),
  )
  others = [n for n in pipes if n != 'winner']
  summary = report.summarize(result, category_names={}, seed=seed, n_resamples=N_RESAMPLES, baselines=others)
  return {'n_questions': len(result.question_ids), 'summary': summary}


def refusals(path: Path, name: str, ledger: Path) -> list[str]:
  """Why this scoring would not be the protocol's one clean scoring (empty when it is)."""
  reasons = []
  if protocol.committed_unmodified(path) is not True:
    reasons.append(f'{rel(path)} is not committed unmodified')
  commit = protocol.git_commit() or ''
  if commit.endswith('+dirty') or not commit:
    reasons.append(f'the tree is not clean (git commit {commit or "unknown"})')
  if protocol.scorings(name, ledger=ledger, committed=LEDGER):
    reasons.append(f'protocol {name} has been scored already (ledger {rel(LEDGER)})')
  return reasons


def markdown(name: str, out: Mapping[str, Any]) -> str:
  w = out['winner']
  lines = [
    f'### Lexical protocol {name}',
    '',
    f'Winner on the selection sets: tokenizer `{w["tokenizer"]}`, form `{w["form"]}`, k1 {w["k1"]}, b {w["b"]} '
    f'(criterion {out["winner_criterion"]:.4f}); adopted: `{out["adopted"]}` ({out["adoption_reason"]}).',
    '',
  ]
  for ds_name, block in out['confirmation'].items():
    metrics = block['metrics']
    lines += [f'Confirmation on {ds_name} ({block["n_questions"]} questions):', '']
    lines += ['| pipeline | ' + ' | '.join(f'{m} [95% CI]' for m in metrics) + ' |', '|---|' + '---|' * len(metrics)]
    for pipe, v in block['summary'].items():
      cells = [f'{v[m]:.4f} [{v["ci95"][m][0]:.4f}, {v["ci95"][m][1]:.4f}]' for m in metrics]
      lines.append(f'| {pipe} | ' + ' | '.join(cells) + ' |')
    lines.append('')
    for other, t in block['summary']['winner'].get('paired', {}).items():
      cells = [f'{m} {t[m]["delta"]:+.4f} [{t[m]["lo"]:+.4f}, {t[m]["hi"]:+.4f}] p={t[m]["p"]:.4f}' for m in metrics]
      lines.append(f'- winner {other}: ' + '; '.join(cells))
    lines.append('')
  return '\n'.join(lines)


def run(name: str, out_dir: Path, *, force: bool, ledger: Path) -> dict[str, Any]:
  path = LEXICAL_DIR / f'{name}.yaml'
  if not path.is_file():
    raise EngramError(f'unknown lexical protocol {name!r}; known: {sorted(p.stem for p in LEXICAL_DIR.glob("*.yaml"))}')
  reasons = refusals(path, name, ledger)
  if reasons and not force:
    raise EngramError(f'lexical protocol {name}: ' + '; '.join(reasons) + ' (--force runs it anyway, marked)')
  if reasons and ledger.resolve() == LEDGER.resolve():
    raise EngramError(f'a forced run ({"; ".join(reasons)}) goes to a scratch ledger: pass --ledger FILE')
  spec = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
  seed, k = int(spec['seed']), int(spec['k'])
  t0 = time.perf_counter()
  locomo, locomo_ds = load(['dataset=locomo'])
  pilot, lme_ds = load(['dataset=longmemeval_s'])
  confirm_lme, _ = load(['dataset=longmemeval_s', 'dataset.loader.part=confirm'])
  chosen = splits.draw_ids([ep.id for ep in locomo], n=int(spec['locomo']['n_selection']), seed=seed)
  loc_sel = [ep for ep in locomo if ep.id in chosen]
  loc_conf = [ep for ep in locomo if ep.id not in chosen]
  splits.assert_disjoint(
    [q.id for ep in loc_sel for q in ep.questions], [q.id for ep in loc_conf for q in ep.questions]
  )
  splits.assert_disjoint(
    [q.id for ep in pilot for q in ep.questions], [q.id for ep in confirm_lme for q in ep.questions]
  )
  g = spec['grid']
  order = [(t, f, float(k1), float(b)) for t, f, k1, b in itertools.product(g['tokenizer'], g['form'], g['k1'], g['b'])]
  selection = {
    'locomo': grid_means(loc_sel, locomo_ds, spec, spec['locomo']['metric'], k=k, seed=seed),
    'longmemeval_s': grid_means(pilot, lme_ds, spec, spec['longmemeval_s']['metric'], k=k, seed=seed),
  }
  best, rows = choose(selection, order)
  winner = dict(zip(('tokenizer', 'form', 'k1', 'b'), best))
  pipes = {
    'winner': pipeline.make_pipeline(
      legs={'bm25': {'op': 'bm25', **winner, 'delta': float(spec['delta'])}}, name='winner'
    ),
    **{n: common.hand_set_pipeline(n) for n in spec['compare']},
  }
  confirmation = {}
  for ds_name, eps, ds in (('locomo', loc_conf, locomo_ds), ('longmemeval_s', confirm_lme, lme_ds)):
    metrics = list(spec[ds_name]['confirm_metrics'])
    confirmation[ds_name] = {**confirm(eps, ds, pipes, metrics, k=k, seed=seed), 'metrics': metrics}
  adopted, why = 'winner', 'no confirmation set puts it below bm25_lucene'
  for ds_name, block in confirmation.items():
    first = block['metrics'][0]
    t = block['summary']['winner']['paired']['vs bm25_lucene'][first]
    if t['hi'] < 0:
      adopted, why = (
        'bm25_lucene',
        f'on {ds_name} the winner is below bm25_lucene ({first} CI [{t["lo"]:.4f}, {t["hi"]:.4f}])',
      )
  out = {
    'protocol': name,
    'sha256': protocol.sha256(path),
    'forced': bool(reasons),
    'forced_because': reasons,
    'locomo_selection_conversations': chosen,
    'n_selection_questions': {
      'locomo': sum(len(ep.questions) for ep in loc_sel),
      'longmemeval_s': sum(len(ep.questions) for ep in pilot),
    },
    'winner': winner,
    'winner_criterion': rows[order.index(best)]['criterion'],
    'adopted': adopted,
    'adoption_reason': why,
    'confirmation': confirmation,
    'seconds': round(time.perf_counter() - t0, 1),
  }
  out_dir.mkdir(parents=True, exist_ok=True)
  (out_dir / 'selection.json').write_text(json.dumps(rows, indent=0) + '\n')
  (out_dir / 'results.json').write_text(json.dumps(out, indent=1) + '\n')
  (out_dir / 'results.md').write_text(markdown(name, out))
  data = {
    ds_name: protocol.data_fingerprint(eps)
    for ds_name, eps in (('locomo', locomo), ('longmemeval_s_pilot', pilot), ('longmemeval_s_confirm', confirm_lme))
  }
  row = {
    'protocol': name,
    'sha256': out['sha256'],
    'forced': out['forced'],
    'forced_because': reasons,
    'data': data,
    'git_commit': protocol.git_commit(),
    'packages': protocol.package_versions(),
    'date': time.strftime('%Y-%m-%dT%H:%M:%S+00:00', time.gmtime()),
    **protocol.run_dir_record(out_dir),
    'winner': winner,
    'adopted': adopted,
    'summary': {
      ds_name: {p: {m: v[m] for m in block['metrics']} for p, v in block['summary'].items()}
      for ds_name, block in confirmation.items()
    },
    'paired': {
      ds_name: {
        other: {m: block['summary']['winner']['paired'][other][m] for m in block['metrics']}
        for other in block['summary']['winner'].get('paired', {})
      }
      for ds_name, block in confirmation.items()
    },
  }
  ledger.parent.mkdir(parents=True, exist_ok=True)
  with ledger.open('a', encoding='utf-8') as f:
    f.write(json.dumps(row) + '\n')
  return out


def main(argv: Sequence[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('name', help='a protocol of conf/lexical/ (e.g. lexical_default)')
  ap.add_argument('--out', default=None, help='output folder (default outputs/protocols/<name>)')
  ap.add_argument('--force', action='store_true', help='run although the protocol is dirty or scored (marked)')
  ap.add_argument('--ledger', default=str(LEDGER), help='the ledger appended to (a scratch one when forced)')
  args = ap.parse_args(argv)
  try:
    out = run(
      args.name,
      Path(args.out or ROOT / 'outputs' / 'protocols' / args.name),
      force=args.force,
      ledger=Path(args.ledger),
    )
  except EngramError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  print(markdown(args.name, out))
  return 0


if __name__ == '__main__':
  raise SystemExit(main())
