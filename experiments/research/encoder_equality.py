"""Same vectors, shown: every encoder backend against today's torch path on all of LoCoMo's texts, and the
per-question scores of the README's main job and of ``experiment=cfsr_table`` with each (issue 51 item 2).

    python -m experiments.research.encoder_equality --cache-dir .cache --out outputs/encoder_equality
    python -m experiments.research.encoder_equality --models minilm --backends onnx,openvino --experiments main

Vectors: LoCoMo's 7,852 distinct texts (items and questions) embedded through the embedding cache under
``--cache-dir`` by torch (``backend=torch``, today's key: a warm cache is read, not recomputed) and by each backend
(``openvino:bf16``: OpenVINO at bfloat16 precision), each into its own cache folder; per backend, the largest
absolute difference of any coordinate and the lowest cosine between a text's two vectors, and the seconds the
backend's encoding took when its cache was cold (``cached`` says when it was not).

Scores: ``python -m experiments.evaluate`` run once per (experiment, model, backend) as a subprocess with
``embedder.encoder.backend`` (and ``precision``) set, into ``<out>/runs/``, on the same cache (so the encoding above
is not repeated); each run's per-question scores (every pipeline, every metric) compared with the torch run's. A
question *moved* when any of its metrics differs; for each moved question the first rank where the two top-k lists
part is given, with the two items there.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from engram_jax.data import embed, packaged

MODELS = {'minilm': 'embedder=minilm', 'mpnet': 'embedder=mpnet'}
BACKENDS = ('onnx', 'openvino', 'openvino:bf16')
EXPERIMENTS = {'main': (), 'cfsr_table': ('experiment=cfsr_table',)}
BASE = 'torch'


def split_backend(name: str) -> tuple[str, str]:
  """``'openvino:bf16'`` -> ``('openvino', 'bf16')``; a bare name is float32.

  >>> split_backend('openvino:bf16'), split_backend('onnx')
  (('openvino', 'bf16'), ('onnx', 'f32'))
  """
  backend, _, precision = name.partition(':')
  return backend, precision or 'f32'


def make_encoder(model: str, name: str, cache_dir: str) -> Any:
  """The encoder of ``model`` (``minilm`` or ``mpnet``) on backend ``name``, as the Hydra embedder nodes make it."""
  backend, precision = split_backend(name)
  if model == 'minilm':
    return embed.sentence_transformer_encoder(
      backend=backend, precision=precision, export_dir=str(Path(cache_dir) / 'exports')
    )
  return packaged.packaged_encoder(cache_dir=cache_dir, backend=backend, precision=precision)


def locomo_texts(root: str | None = None) -> list[str]:
  """LoCoMo's distinct item and question texts, sorted."""
  from engram_jax.data.locomo import load_locomo

  episodes, _ = load_locomo(root)
  return sorted({t for ep in episodes for t in [*(it.text for it in ep.items), *(q.text for q in ep.questions)]})


def vector_agreement(base: np.ndarray, other: np.ndarray) -> dict[str, float]:
  """Max absolute difference and min cosine between the rows of two ``[T, D]`` unit-norm arrays.

  >>> a = np.eye(2, dtype=np.float32)
  >>> vector_agreement(a, a)
  {'max_abs_diff': 0.0, 'min_cosine': 1.0}
  """
  a, b = base.astype(np.float64), other.astype(np.float64)
  return {'max_abs_diff': float(np.abs(a - b).max()), 'min_cosine': float((a * b).sum(1).min())}


def embed_all(model: str, name: str, texts: list[str], cache_dir: str) -> tuple[np.ndarray, dict[str, Any]]:
  """``texts`` embedded by ``model`` on backend ``name`` through the cache; the vectors and what it took."""
  encoder = make_encoder(model, name, cache_dir)
  model_id = packaged.MPNET if model == 'mpnet' else embed.DEFAULT_MODEL
  t0 = time.perf_counter()
  vecs, report = embed.embed_with_report(texts, cache_dir=cache_dir, model_id=model_id, encoder=encoder, progress=False)
  seconds = time.perf_counter() - t0
  return vecs, {'seconds': seconds, 'embedded': report.embedded, 'cached': report.cached, 'folder': report.folder}


def vector_rows(
  models: Sequence[str], names: Sequence[str], texts: list[str], cache_dir: str, log=print
) -> list[dict[str, Any]]:
  """One row per (model, backend), torch first: agreement with torch's vectors and the encoding's cost."""
  rows = []
  for model in models:
    base, info = embed_all(model, BASE, texts, cache_dir)
    rows.append({'model': model, 'backend': BASE, **info, **vector_agreement(base, base)})
    log(f'{model} {BASE}: {info}')
    for name in names:
      vecs, info = embed_all(model, name, texts, cache_dir)
      rows.append({'model': model, 'backend': name, **info, **vector_agreement(base, vecs)})
      log(f'{model} {name}: {rows[-1]}')
  return rows


def evaluate(overrides: Sequence[str], run_dir: Path, cache_dir: str) -> list[dict[str, Any]]:
  """The per-question records of ``python -m experiments.evaluate *overrides`` run into ``run_dir`` (reused when a
  finished run is there)."""
  results = run_dir / 'results.json'
  if not results.is_file():
    cmd = [
      sys.executable,
      '-m',
      'experiments.evaluate',
      *overrides,
      f'paths.cache_dir={cache_dir}',
      'eval.progress=false',
      f'hydra.run.dir={run_dir}',
    ]
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir.with_suffix('.log'), 'w') as out:  # the run's table and log, beside its folder
      subprocess.run(cmd, check=True, env={**os.environ, 'HF_HUB_OFFLINE': '1'}, stdout=out, stderr=subprocess.STDOUT)
  return json.loads(results.read_text())['per_question']


def moved_questions(
  base: Sequence[Mapping[str, Any]], other: Sequence[Mapping[str, Any]]
) -> dict[str, list[dict[str, Any]]]:
  """Per pipeline, the questions whose scores differ between two runs' per-question records (same order), each with
  its id, the metrics that moved and the first rank where the two retrieved lists part (``None``: same lists)."""
  out: dict[str, list[dict[str, Any]]] = {p: [] for p in base[0]['scores']} if base else {}
  for a, b in zip(base, other, strict=True):
    if (a['episode'], a['id']) != (b['episode'], b['id']):
      raise ValueError(f'the runs score other questions: {a["id"]} vs {b["id"]}')
    for pipe, scores in a['scores'].items():
      delta = {m: b['scores'][pipe][m] - v for m, v in scores.items() if b['scores'][pipe][m] != v}
      if delta:
        ra, rb = a['retrieved'][pipe], b['retrieved'][pipe]
        part = next((i for i, (x, y) in enumerate(zip(ra, rb)) if x != y), None)
        swapped = (ra[part], rb[part]) if part is not None else None
        out[pipe].append({'episode': a['episode'], 'id': a['id'], 'delta': delta, 'rank': part, 'swapped': swapped})
  return out


def score_rows(
  models: Sequence[str], names: Sequence[str], experiments: Sequence[str], out: Path, cache_dir: str, log=print
) -> list[dict[str, Any]]:
  """One row per (experiment, model, backend): questions and pipelines compared, moved questions per pipeline."""
  rows = []
  for exp in experiments:
    for model in models:
      runs = {}
      for name in (BASE, *names):
        backend, precision = split_backend(name)
        overrides = [
          *EXPERIMENTS[exp],
          MODELS[model],
          f'embedder.encoder.backend={backend}',
          f'embedder.encoder.precision={precision}',
        ]
        t0 = time.perf_counter()
        runs[name] = evaluate(overrides, out / 'runs' / f'{exp}-{model}-{name.replace(":", "-")}', cache_dir)
        log(f'{exp} {model} {name}: {time.perf_counter() - t0:.0f} s')
      for name in names:
        moved = moved_questions(runs[BASE], runs[name])
        rows.append(
          {
            'experiment': exp,
            'model': model,
            'backend': name,
            'questions': len(runs[BASE]),
            'pipelines': len(moved),
            'moved': {p: len(v) for p, v in moved.items()},
            'moved_questions': {p: v for p, v in moved.items() if v},
            'means': mean_scores(runs[name]),
            'torch_means': mean_scores(runs[BASE]),
          }
        )
  return rows


def mean_scores(records: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
  """Per pipeline and metric, the mean over the per-question records (the run's table's numbers).

  >>> mean_scores([{'scores': {'cos': {'ndcg@10': 1.0}}}, {'scores': {'cos': {'ndcg@10': 0.5}}}])
  {'cos': {'ndcg@10': 0.75}}
  """
  pipes = records[0]['scores'] if records else {}
  return {p: {m: float(np.mean([r['scores'][p][m] for r in records])) for m in metrics} for p, metrics in pipes.items()}


def format_vectors(rows: Sequence[Mapping[str, Any]], n_texts: int) -> str:
  """The Markdown table of :func:`vector_rows`."""
  lines = [
    f"Vectors of all {n_texts} LoCoMo texts against torch's (today's path):",
    '',
    '| model | backend | max abs diff | min cosine | cold encode s (texts embedded) |',
    '|---|---|---|---|---|',
  ]
  for r in rows:
    cold = f'{r["seconds"]:.1f} ({r["embedded"]})' if r['embedded'] else f'cached ({r["cached"]})'
    lines.append(f'| {r["model"]} | {r["backend"]} | {r["max_abs_diff"]:.1e} | {r["min_cosine"]:.6f} | {cold} |')
  return '\n'.join(lines)


def format_means(rows: Sequence[Mapping[str, Any]], metrics: Sequence[str] = ('ndcg@10', 'recall@10')) -> str:
  """Per (experiment, model, backend) whose scores moved, each pipeline's mean metrics beside torch's."""
  lines = []
  for r in rows:
    if not sum(r['moved'].values()):
      continue
    lines += [
      f'{r["experiment"]}, {r["model"]}: {r["backend"]} against torch (means over {r["questions"]} questions)',
      '',
      '| pipeline | ' + ' | '.join(f'{m} torch | {m} {r["backend"]} | difference' for m in metrics) + ' |',
      '|---|' + '---|---|---|' * len(metrics),
    ]
    for pipe, means in r['means'].items():
      cells = [
        f'{r["torch_means"][pipe][m]:.4f} | {means[m]:.4f} | {means[m] - r["torch_means"][pipe][m]:+.4f}'
        for m in metrics
      ]
      lines.append(f'| {pipe} | ' + ' | '.join(cells) + ' |')
    lines.append('')
  return '\n'.join(lines)


def format_scores(rows: Sequence[Mapping[str, Any]], shown: int = 5) -> str:
  """The Markdown table of :func:`score_rows`, then the first ``shown`` moved questions of each row."""
  lines = [
    'Per-question scores against the torch run of the same experiment and model:',
    '',
    '| experiment | model | backend | questions x pipelines | moved (question, pipeline) pairs | pipelines moved |',
    '|---|---|---|---|---|---|',
  ]
  notes = []
  for r in rows:
    total = sum(r['moved'].values())
    which = ', '.join(f'{p} {n}' for p, n in r['moved'].items() if n) or 'none'
    lines.append(
      f'| {r["experiment"]} | {r["model"]} | {r["backend"]} | {r["questions"]} x {r["pipelines"]} | {total} | {which} |'
    )
    listed = [(pipe, q) for pipe, qs in r['moved_questions'].items() for q in qs]
    if len(listed) > shown:
      notes.append(f'- {r["experiment"]} {r["model"]} {r["backend"]}: {len(listed)} moved; the first {shown}:')
    for pipe, q in listed[:shown]:
      delta = ', '.join(f'{m} {d:+.4f}' for m, d in q['delta'].items())
      notes.append(
        f'- {r["experiment"]} {r["model"]} {r["backend"]} {pipe} {q["episode"]}/{q["id"]}: {delta}; '
        f'lists part at rank {q["rank"]} ({q["swapped"]})'
      )
  return '\n'.join(lines + ([''] + notes if notes else []))


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  ap.add_argument('--models', default=','.join(MODELS))
  ap.add_argument('--backends', default=','.join(BACKENDS))
  ap.add_argument('--experiments', default=','.join(EXPERIMENTS))
  ap.add_argument('--cache-dir', default=os.environ.get('ENGRAM_CACHE_DIR', '.cache'))
  ap.add_argument('--root', default=None, help='LoCoMo data root (default: as the loaders find it)')
  ap.add_argument('--out', default='outputs/encoder_equality')
  ap.add_argument('--no-scores', action='store_true', help='vectors only')
  args = ap.parse_args(argv)
  models = [m for m in args.models.split(',') if m]
  names = [b for b in args.backends.split(',') if b]
  experiments = [e for e in args.experiments.split(',') if e]
  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  log = lambda s: print(s, file=sys.stderr, flush=True)
  texts = locomo_texts(args.root)
  vrows = vector_rows(models, names, texts, args.cache_dir, log=log)
  text = format_vectors(vrows, len(texts))
  srows = [] if args.no_scores else score_rows(models, names, experiments, out, args.cache_dir, log=log)
  if srows:
    text += '\n\n' + format_scores(srows) + '\n\n' + format_means(srows)
  print(text)
  result = {'texts': len(texts), 'vectors': vrows, 'scores': srows}
  (out / 'equality.json').write_text(json.dumps(result, indent=1))
  (out / 'equality.md').write_text(text + '\n')
  return result


if __name__ == '__main__':
  main()
