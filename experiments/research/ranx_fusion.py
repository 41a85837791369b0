"""The fusion peer, measured (issue 42 item 5): ranx's ``optimize_fusion`` (wsum and rrf, ranx's own grids) against
our gradient fit and our exhaustive grid of the fusion knobs of ``rrf_cos_bm25_cfsr``, on the same cross-fitting
folds, scored out of fold with the project's metrics.

  python -m experiments.research.ranx_fusion --out outputs/peers/ranx_fusion --docs docs/peers.md

The gradient fit is the fit entry point's run, made here first (twice, in ``OUT/fit`` and ``OUT/fit_again``: the
second one finds the compiled programs in the compilation cache; both must score every question alike)::

  python -m experiments.fit 'pipeline=[rrf_cos_bm25_cfsr]' \\
      'fit.params=[legs.cos.weight,legs.bm25.weight,legs.cfsr.weight,k0]' fit.split=crossfit fit.folds=10 \\
      fit.gap_checks=0 eval.progress=false hydra.run.dir=OUT/fit

(``--fit-run DIR`` reads such a run instead). Its folder is read (``results.json``, ``split.json``,
``config_resolved.yaml``); everything else is computed here from the same configuration (dataset, embedder, seed,
``eval.k``, the pipeline's hand-set legs) and the same folds (:func:`engram_jax.fit.episode_folds` with ``fit.folds``
and ``fit.seed``, checked equal to the fit's ``split.json``):

* the three legs (``cos``, ``bm25``, ``cfsr``) at their hand-set knobs, each question's top ``depth`` items as the
  pipeline's fusion reads them (depth 10, 10, 50; ties broken by the project's rule), with the legs' own scores, as
  ranx ``Run`` dicts; written as TREC runs by the project's writer (rank order) and by ranx (its own scores), with
  the qrels;
* per fold, ranx ``optimize_fusion`` on the training conversations' questions (``metric='ndcg@10'``, ranx's default
  ``norm='min-max'``, ranx's default grids: wsum weights in 0, 0.1, ..., 1 summing to 1; rrf ``k`` in 10, 20, ...,
  100), then ``fuse`` of the held-out conversation's runs with the parameters found;
* our exhaustive grid over the same four knobs (three leg weights and ``k0``) in one
  :func:`engram_jax.eval.grid.evaluate_grid` call, each fold scored with the point best on the other folds
  (:func:`engram_jax.eval.evaluation.crossfit_choose`);
* every method's out-of-fold ndcg@10 and recall@10 by :mod:`engram_jax.metrics.labels`, bootstrap CIs and paired
  differences against the gradient fit (:func:`engram_jax.metrics.stats.paired_tests`), wall times (ranx: the first
  call with numba's JIT, its cache pointed at an empty folder, then the folds after it).

Writes ``results.json``, ``results.md`` and ``runs/`` into ``--out``; with ``--docs``, the table between the markers
``<!-- ranx_fusion:begin -->`` and ``<!-- ranx_fusion:end -->`` of that page.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from engram_jax.core.errors import EngramError

PIPELINE = 'rrf_cos_bm25_cfsr'
LEGS = ('cos', 'bm25', 'cfsr')
FUSION_KNOBS = ('legs.cos.weight', 'legs.bm25.weight', 'legs.cfsr.weight', 'k0')
METRICS = ('ndcg@10', 'recall@10')
DATASET_NAMES = {'locomo': 'LoCoMo'}  # how the table's caption names a dataset (else its config name)
RANX_METHODS = ('wsum', 'rrf')
RANX_NORM = 'min-max'  # ranx's default for optimize_fusion and fuse
# our exhaustive grid: every weight on one list, k0 log-spaced (7^4 = 2,401 points)
GRID = {
  'legs.cos.weight': [0.0, 0.25, 0.5, 1.0, 2.0, 3.0, 4.0],
  'legs.bm25.weight': [0.0, 0.25, 0.5, 1.0, 2.0, 3.0, 4.0],
  'legs.cfsr.weight': [0.0, 0.25, 0.5, 1.0, 2.0, 3.0, 4.0],
  'k0': [1.0, 2.0, 5.0, 10.0, 20.0, 60.0, 100.0],
}
BEGIN, END = '<!-- ranx_fusion:begin -->', '<!-- ranx_fusion:end -->'
FIT_OVERRIDES = (
  f'pipeline=[{PIPELINE}]',
  f'fit.params=[{",".join(FUSION_KNOBS)}]',
  'fit.split=crossfit',
  'fit.folds=10',
  'fit.gap_checks=0',
  'eval.progress=false',
)

# ---- pure pieces (no ranx, no JAX) -------------------------------------------------------------------------------


def run_dict(
  qids: Sequence[str], item_ids: Sequence[str], idx: np.ndarray, vals: np.ndarray
) -> dict[str, dict[str, float]]:
  """A ranx ``Run`` dict ``{qid: {docid: score}}`` of each question's ranked list, in rank order.

  ``idx [Q, D]`` item indices into ``item_ids`` in rank order and ``vals [Q, D]`` their scores; entries whose score
  is not finite (a leg that ranks fewer than ``D`` items, padding) are left out.

  Example:
    >>> import numpy as np
    >>> run_dict(['q1'], ['a', 'b', 'c'], np.array([[2, 0, 1]]), np.array([[0.9, 0.5, -np.inf]]))
    {'q1': {'c': 0.9, 'a': 0.5}}
  """
  idx, vals = np.asarray(idx), np.asarray(vals, np.float64)
  if idx.shape != vals.shape or idx.shape[0] != len(qids):
    raise ValueError(f'shapes: {len(qids)} questions, idx {idx.shape}, vals {vals.shape}')
  return {
    q: {item_ids[int(j)]: float(v) for j, v in zip(row_i, row_v) if np.isfinite(v)}
    for q, row_i, row_v in zip(qids, idx, vals)
  }


def qrels_dict(qids: Sequence[str], gold: Sequence[Sequence[str]]) -> dict[str, dict[str, int]]:
  """A ranx ``Qrels`` dict ``{qid: {docid: 1}}`` (binary relevance, as the project's label metrics)."""
  return {q: {d: 1 for d in g} for q, g in zip(qids, gold, strict=True)}


def subset(d: Mapping[str, Any], qids: Sequence[str]) -> dict[str, Any]:
  """``d`` restricted to ``qids`` (in that order); a qid ``d`` lacks is an error."""
  missing = [q for q in qids if q not in d]
  if missing:
    raise KeyError(f'{len(missing)} question ids not in the run, e.g. {missing[0]!r}')
  return {q: d[q] for q in qids}


def fold_qids(episode_of: Mapping[str, str], fold: Sequence[str]) -> tuple[list[str], list[str]]:
  """``(train, held_out)`` question ids of one fold: held out = questions of the fold's episodes (in the order of
  ``episode_of``), train = every other question; asserted disjoint.

  Example:
    >>> fold_qids({'q1': 'e1', 'q2': 'e2', 'q3': 'e1'}, ['e1'])
    (['q2'], ['q1', 'q3'])
  """
  fold = set(fold)
  held = [q for q, e in episode_of.items() if e in fold]
  train = [q for q, e in episode_of.items() if e not in fold]
  if set(held) & set(train) or not held or not train:
    raise EngramError(f'fold {sorted(fold)}: {len(train)} training and {len(held)} held-out questions')
  return train, held


def weighted_rrf(lists: Sequence[Mapping[str, float]], weights: Sequence[float], k0: float) -> dict[str, float]:
  """Weighted RRF of rank-ordered lists (as :func:`engram_jax.ops.rrf.rrf_fuse` over each leg's top-depth):
  ``sum_l w_l / (k0 + rank_l)``, float64.

  Example:
    >>> weighted_rrf([{'a': 9.0, 'b': 1.0}, {'b': 0.3}], [1.0, 2.0], 1.0)
    {'a': 0.5, 'b': 1.3333333333333333}
  """
  out: dict[str, float] = {}
  for lst, w in zip(lists, weights, strict=True):
    for r, d in enumerate(lst, start=1):
      out[d] = out.get(d, 0.0) + w / (k0 + r)
  return out


def ranked(scores: Mapping[str, float], position: Mapping[str, int], k: int) -> list[str]:
  """The ``k`` best ids of ``scores``, ties to the later item (larger ``position``), the project's rule.

  Example:
    >>> ranked({'a': 1.0, 'b': 2.0, 'c': 1.0}, {'a': 0, 'b': 1, 'c': 2}, 2)
    ['b', 'c']
  """
  return sorted(scores, key=lambda d: (-scores[d], -position[d]))[:k]


def label_scores(
  top: Sequence[Sequence[str]], gold: Sequence[Sequence[str]], items: Sequence[str], *, k: int
) -> dict[str, np.ndarray]:
  """ndcg@k and recall@k ``[Q]`` of ranked id lists against gold ids in one episode (``items``: its item ids), by
  the project's label metrics (NumPy float64)."""
  from engram_jax.metrics import labels

  at = {d: i for i, d in enumerate(items)}
  topk = np.full((len(top), k), -1, np.int64)
  for i, row in enumerate(top):
    ids = [at[d] for d in row[:k]]
    topk[i, : len(ids)] = ids
  lab = np.zeros((len(top), len(items)), bool)
  for i, g in enumerate(gold):
    lab[i, [at[d] for d in g]] = True
  return {'ndcg@10': labels.ndcg_at_k(topk, lab, k=k), 'recall@10': labels.recall_at_k(topk, lab, k=k)}


def replace_between(text: str, body: str, begin: str = BEGIN, end: str = END) -> str:
  """``text`` with what lies between the ``begin`` and ``end`` lines replaced by ``body``.

  Example:
    >>> replace_between('x\\n<!-- b -->\\nold\\n<!-- e -->\\ny\\n', 'new\\n', '<!-- b -->', '<!-- e -->')
    'x\\n<!-- b -->\\nnew\\n<!-- e -->\\ny\\n'
  """
  i, j = text.find(begin), text.find(end)
  if i < 0 or j < i:
    raise EngramError(f'markers {begin} ... {end} not found in order')
  return text[: i + len(begin)] + '\n' + body + text[j:]


# ---- the experiment ----------------------------------------------------------------------------------------------


def uptime() -> str:
  try:
    return subprocess.run(['uptime'], capture_output=True, text=True, check=False).stdout.strip()
  except OSError:
    return 'uptime unavailable'


def run_fit(folder: Path) -> dict[str, Any]:
  """``python -m experiments.fit`` with :data:`FIT_OVERRIDES` into ``folder``: its wall time and the load before
  and after."""
  argv = [sys.executable, '-m', 'experiments.fit', *FIT_OVERRIDES, f'hydra.run.dir={folder}']
  before = uptime()
  t = time.perf_counter()
  done = subprocess.run(argv, capture_output=True, text=True, check=False)
  wall = time.perf_counter() - t
  if done.returncode:
    raise EngramError(f'experiments.fit failed ({done.returncode}): {done.stderr.strip().splitlines()[-1:]}')
  return {'command': ' '.join(argv[1:]), 'process_s': wall, 'load_before': before, 'load_after': uptime()}


def read_fit(folder: Path) -> tuple[Any, dict[str, Any], dict[str, Any]]:
  """The gradient fit's resolved config, ``results.json`` and ``split.json``; refused unless it fit exactly the
  fusion knobs of ``rrf_cos_bm25_cfsr`` by cross-fitting."""
  from omegaconf import OmegaConf

  from engram_jax.core import runfolder
  from experiments.lib import fit_setup

  runfolder.check(folder, ['results.json', 'split.json', 'config_resolved.yaml'])
  cfg = OmegaConf.load(folder / 'config_resolved.yaml')
  results = json.loads((folder / 'results.json').read_text())
  split = json.loads((folder / 'split.json').read_text())
  want = {'pipeline': PIPELINE, 'params': list(FUSION_KNOBS), 'split': 'crossfit'}
  got = {'pipeline': results['pipeline'], 'params': results['params'], 'split': split['kind']}
  # a fit with components declares them in fit.variants (experiments.lib.fit_setup refuses a set component no
  # variant lists), whichever module registered them
  if got != want or fit_setup.read(cfg, PIPELINE).config.variants:
    raise EngramError(f'{folder}: not a cross-fit of the fusion knobs only ({got}; wanted {want}, no fit.variants)')
  return cfg, results, split


def export_legs(pipe, episodes, arrays, *, seed: int) -> dict[str, dict[str, dict[str, float]]]:
  """Each leg's top ``depth`` per question with its own scores: ``{leg: {qid: {docid: score}}}`` (rank order)."""
  import jax
  import jax.numpy as jnp

  from engram_jax.core import ranking
  from engram_jax.eval import pipeline

  out: dict[str, dict[str, dict[str, float]]] = {leg.name: {} for leg in pipe.legs}
  for e, (ep, arr) in enumerate(zip(episodes, arrays)):
    scores = pipeline.legs_scores(pipe, arr, jax.random.fold_in(jax.random.key(seed), e), {})
    qids, items = [q.id for q in ep.questions], [it.id for it in ep.items]
    for leg, s in zip(pipe.legs, scores):
      idx, vals = ranking.top_k(s, k=min(leg.depth, len(items)), where=arr.where & jnp.isfinite(s))
      out[leg.name].update(run_dict(qids, items, np.asarray(idx)[: len(qids)], np.asarray(vals)[: len(qids)]))
  return out


def write_runs(folder: Path, legs, episodes, qids_all: list[str]) -> dict[str, str]:
  """TREC runs of the legs (the project's writer: rank order; ranx's writer: the legs' scores) and the qrels."""
  from ranx import Run

  from engram_jax.eval import trec

  folder.mkdir(parents=True, exist_ok=True)
  files = {}
  for name, run in legs.items():
    path = folder / f'{name}.trec'
    path.write_text(trec.trec_run(qids_all, [list(run[q]) for q in qids_all], tag=name))
    scored = folder / f'{name}.scores.trec'
    Run.from_dict({q: dict(run[q]) for q in qids_all}, name=name).save(str(scored))
    files[name] = str(path)
    files[f'{name} (scores)'] = str(scored)
  gold = {q.id: q.gold for ep in episodes for q in ep.questions}
  (folder / 'locomo.qrels').write_text(trec.trec_qrels(qids_all, [gold[q] for q in qids_all]))
  files['qrels'] = str(folder / 'locomo.qrels')
  return files


def ranx_folds(legs, qrels, episode_of, folds, method: str) -> dict[str, Any]:
  """ranx ``optimize_fusion`` per fold on the training questions, then ``fuse`` of the held-out runs: each held-out
  question's fused list (ranx's order), the parameters per fold, the times and ranx's own per-question scores."""
  from ranx import Qrels, Run, evaluate, fuse, optimize_fusion

  def runs(qids):
    return [Run.from_dict(subset(legs[leg], qids), name=leg) for leg in LEGS]

  # the first call: numba's JIT (or its on-disk cache) and ranx's set-up, on fold 0
  train0, _ = fold_qids(episode_of, folds[0])
  t = time.perf_counter()
  optimize_fusion(
    qrels=Qrels.from_dict(subset(qrels, train0)), runs=runs(train0), norm=RANX_NORM, method=method,
    metric='ndcg@10', show_progress=False,
  )  # fmt: skip
  first_s = time.perf_counter() - t
  fused, params, own, opt_s, fuse_s = {}, {}, {}, [], []
  for fold in folds:
    train, held = fold_qids(episode_of, fold)
    qrels_tr, runs_tr, runs_held = Qrels.from_dict(subset(qrels, train)), runs(train), runs(held)
    t = time.perf_counter()
    best = optimize_fusion(
      qrels=qrels_tr, runs=runs_tr, norm=RANX_NORM, method=method, metric='ndcg@10', show_progress=False
    )
    opt_s.append(time.perf_counter() - t)
    t = time.perf_counter()
    out = fuse(runs=runs_held, norm=RANX_NORM, method=method, params=best)
    fuse_s.append(time.perf_counter() - t)
    if not out.sorted:
      out.sort()
    got = out.to_dict()
    fused.update({q: list(got.get(q, {})) for q in held})
    evaluate(Qrels.from_dict(subset(qrels, held)), out, list(METRICS), save_results_in_run=True)
    own.update({q: {m: float(out.scores[m][q]) for m in METRICS} for q in held})
    params[','.join(fold)] = {
      k: ([float(x) for x in v] if isinstance(v, (list, tuple)) else v) for k, v in best.items()
    }
  return {'fused': fused, 'params': params, 'ranx_scores': own, 'first_call_s': first_s, 'optimise_s': opt_s,
          'fuse_s': fuse_s}  # fmt: skip


def ranx_grid_sizes() -> dict[str, Any]:
  """The sizes of ranx's default grids for three runs (its own helpers)."""
  from ranx.fusion_optimization.optimize_weights import get_possible_weights, get_trial_configs

  return {
    'wsum': {'step': 0.1, 'trials': len(get_trial_configs(get_possible_weights(0.1), len(LEGS)))},
    'rrf': {'k': list(range(10, 101, 10)), 'trials': 10},
  }


def numba_threads() -> int:
  import numba

  return int(numba.get_num_threads())


def chosen_summary(params_by_fold: Mapping[str, Mapping[str, Any]]) -> str:
  """The parameters chosen per fold in one line: each distinct setting with its number of folds, or (more than
  three settings) each knob's range.

  Example:
    >>> chosen_summary({'a': {'k': 10}, 'b': {'k': 10}, 'c': {'k': 20}})
    'k=10: 2; k=20: 1'
  """
  fmt = lambda v: f'{v:.4g}' if isinstance(v, float) else str(v)
  settings = [', '.join(f'{k}={fmt(v)}' for k, v in p.items()) for p in params_by_fold.values()]
  distinct = list(dict.fromkeys(settings))
  if len(distinct) <= 3:
    return '; '.join(f'{d}: {settings.count(d)}' for d in distinct)
  keys = list(next(iter(params_by_fold.values())))
  return ', '.join(
    f'{k} {min(p[k] for p in params_by_fold.values()):.3g}..{max(p[k] for p in params_by_fold.values()):.3g}'
    for k in keys
  )


def _p(p: float) -> str:
  return f'{p:.2g}' if p >= 0.001 else '<0.001'


def markdown(res: Mapping[str, Any]) -> str:
  """The comparison table (and what produced it)."""
  head = '| method | ' + ' | '.join(f'{m} [95% CI]' for m in METRICS)
  head += ' | ' + ' | '.join(f'{m} minus gradient fit [95% CI], p' for m in METRICS) + ' | fit / optimise time |'
  lines = [
    f'**{DATASET_NAMES.get(res["dataset"], res["dataset"])}, {res["n_questions"]} questions, k = 10, '
    f'{res["embedder"]}; {len(res["folds"])} folds by episode (`fit.seed` {res["fold_seed"]}), every question scored '
    'with knobs chosen on the other folds.**',
    '',
    head,
    '|---|' + '---|' * (2 * len(METRICS) + 1),
  ]
  for name, row in res['methods'].items():
    cells = [f'{row["summary"][m]["mean"]:.4f} [{row["summary"][m]["lo"]:.3f}, {row["summary"][m]["hi"]:.3f}]'
             for m in METRICS]  # fmt: skip
    for m in METRICS:
      t = row.get('paired_vs_gradient', {}).get(m)
      cells.append('-' if t is None else f'{t["delta"]:+.4f} [{t["lo"]:+.4f}, {t["hi"]:+.4f}], {_p(t["p"])}')
    cells.append(row['time_text'])
    lines.append(f'| {name} | ' + ' | '.join(cells) + ' |')
  c = res['checks']
  lines += ['', 'Chosen per fold (value: number of folds):', '']
  for name, row in res['methods'].items():
    if row.get('params_by_fold'):
      lines.append(f'- {name}: {chosen_summary(row["params_by_fold"])}')
  lines += [
    '',
    f'ranx {res["ranx"]["version"]}, `optimize_fusion(metric="ndcg@10", norm="{RANX_NORM}")` (its default norm) and '
    f'its default grids: wsum weights on 0, 0.1, ..., 1 summing to 1 ({res["ranx"]["grids"]["wsum"]["trials"]} '
    'combinations for three runs; weights in the order cos, bm25, cfsr), rrf `k` in 10, 20, ..., 100 (unweighted: '
    "ranx's rrf has no leg weights). "
    'Its input: the three legs of `rrf_cos_bm25_cfsr` at their hand-set knobs as runs (cosine top 10, BM25 top 10, '
    "CFS-R top 50, with the legs' own scores). Our grid: "
    + ', '.join(f'`{k}` {v}' for k, v in res['grid']['axes'].items())
    + f' ({res["grid"]["points"]} points, each fold the point best on the other folds by mean ndcg@10, ties to the '
    f'first). Gradient fit: `experiments.fit` with `fit.params` the same four knobs, {res["steps"]} Adam steps per '
    'fold.',
    '',
    f"Checks: the exported legs fused by weighted RRF here give the project's top-10 on "
    f"{c['export_vs_hand_set']['equal']}/{c['export_vs_hand_set']['n']} questions (hand-set knobs) and the fit's "
    f'per-question ndcg@10 on {c["export_vs_fitted"]["equal"]}/{c["export_vs_fitted"]["n"]} (fitted knobs per '
    f"fold); ranx's own `evaluate` of its fused runs equals our ndcg@10 and recall@10 on "
    + ', '.join(f'{v["equal"]}/{v["n"]} ({k})' for k, v in c['ranx_evaluate'].items())
    + ' held-out questions'
    + ('' if c.get('fits_identical') is None else f'; the second gradient fit identical: {c["fits_identical"]}')
    + '.',
    '',
    f'Times on 2 shared CPU cores ({res["load"]["start"].split("load average:")[-1].strip()} load average at the '
    f'start, {res["load"]["end"].split("load average:")[-1].strip()} at the end). {res["time_note"]}',
  ]
  return '\n'.join(lines) + '\n'


def check_args(args: argparse.Namespace) -> None:
  """Refuse, before any work, what would fail after it: a ``--docs`` page that is missing or lacks the markers,
  ``--render`` without ``OUT/results.json``, a ``--fit-run`` that is not an existing folder, ``--n-resamples`` < 1."""
  if args.n_resamples < 1:
    raise EngramError(f'--n-resamples {args.n_resamples}: needs at least 1')
  if args.docs is not None:
    page = Path(args.docs)
    if not page.is_file():
      raise EngramError(f'--docs {page}: no such file')
    replace_between(page.read_text(), '')  # raises when the markers are missing
  if args.render and not (Path(args.out) / 'results.json').is_file():
    raise EngramError(f'--render: {Path(args.out) / "results.json"} not found (run without --render first)')
  if args.fit_run is not None and not Path(args.fit_run).is_dir():
    raise EngramError(f'--fit-run {args.fit_run}: no such folder')


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  ap = argparse.ArgumentParser(prog='python -m experiments.research.ranx_fusion', description=__doc__.split('\n\n')[0])
  ap.add_argument(
    '--fit-run', default=None, help='a finished experiments.fit run of the fusion knobs (default: run it)'
  )
  ap.add_argument('--out', required=True, help='the run folder to write')
  ap.add_argument('--docs', default=None, help='a Markdown page whose ranx_fusion markers receive the table')
  ap.add_argument('--n-resamples', type=int, default=10_000)
  ap.add_argument('--render', action='store_true', help="only rewrite results.md (and --docs) from OUT's results.json")
  args = ap.parse_args(argv)
  check_args(args)
  if args.render:
    res = json.loads((Path(args.out) / 'results.json').read_text())
    return write_tables(res, Path(args.out), args.docs)
  load_start = uptime()
  out_dir = Path(args.out)
  out_dir.mkdir(parents=True, exist_ok=True)
  # numba (ranx) compiles into an empty cache folder, so that the first call measures its JIT
  os.environ['NUMBA_CACHE_DIR'] = tempfile.mkdtemp(prefix='numba_', dir=out_dir)
  fit_runs = {}
  if args.fit_run is None:
    for label in ('fit', 'fit_again'):
      fit_runs[label] = run_fit(out_dir / label)
    args.fit_run = str(out_dir / 'fit')
  import jax  # noqa: F401  (after argparse: --help stays fast)

  from engram_jax.eval import evaluation, grid
  from engram_jax.eval.legcache import LegCache
  from engram_jax.fit import episode_folds
  from engram_jax.metrics import stats
  from experiments import fit as fit_entry
  from experiments.lib import common, fit_setup

  cfg, fit_res, split = read_fit(Path(args.fit_run))
  if 'fit_again' in fit_runs:  # the second fit must fit and score alike (recorded; the first one is scored)
    _, again, _ = read_fit(out_dir / 'fit_again')
    fit_runs['identical'] = again['per_question'] == fit_res['per_question'] and again['fitted'] == fit_res['fitted']
    for label, r in (('fit', fit_res), ('fit_again', again)):
      fit_runs[label]['timing'] = r['timing']
  k, seed = int(cfg.eval.k), int(cfg.seed)
  if k != 10:
    raise EngramError(f'{args.fit_run}: eval.k={k}; this comparison is at k = 10')
  pipe = common.hand_set_pipeline(PIPELINE, cfg.pipeline[PIPELINE])
  if [leg.name for leg in pipe.legs] != list(LEGS):
    raise EngramError(f'{PIPELINE}: legs {[leg.name for leg in pipe.legs]}, expected {list(LEGS)}')
  from engram_jax.eval import pipeline as pipeline_mod

  episodes, embeddings, arrays = fit_entry.prepare(cfg, pipeline_mod.build_options([pipe]))
  fit_config = fit_setup.read(cfg, PIPELINE).config
  folds = episode_folds([e.id for e in episodes], n_folds=fit_config.folds, seed=fit_config.seed)
  if [f['scored_episodes'] for f in split['folds']] != folds:
    raise EngramError(
      f'{args.fit_run}/split.json: folds differ from episode_folds({fit_config.folds}, {fit_config.seed})'
    )
  episode_of = {q.id: e.id for e in episodes for q in e.questions}
  qids_all = list(episode_of)
  if sorted(fit_res['per_question']['question_ids']) != sorted(qids_all):
    raise EngramError(f'{args.fit_run}: its questions differ from the dataset read here')
  gold = {q.id: q.gold for e in episodes for q in e.questions}
  position = {e.id: {it.id: it.position for it in e.items} for e in episodes}

  def scores_of(top: Mapping[str, Sequence[str]]) -> dict[str, np.ndarray]:
    """Per-question ndcg@10 / recall@10 [Q] (qids_all order) of ranked lists by question id."""
    parts = {m: {} for m in METRICS}
    for e in episodes:
      qs = [q.id for q in e.questions]
      got = label_scores([top[q] for q in qs], [gold[q] for q in qs], [it.id for it in e.items], k=k)
      for m in METRICS:
        parts[m].update(zip(qs, got[m].tolist()))
    return {m: np.asarray([parts[m][q] for q in qids_all], np.float64) for m in METRICS}

  # 1. the legs, exported
  t = time.perf_counter()
  legs = export_legs(pipe, episodes, arrays, seed=seed)
  export_s = time.perf_counter() - t
  qrels = qrels_dict(qids_all, [gold[q] for q in qids_all])
  files = write_runs(out_dir / 'runs', legs, episodes, qids_all)

  # the hand-set reference (the project's evaluate) and the export check: the legs fused here give its top-10
  ref = evaluation.evaluate(episodes, embeddings, {PIPELINE: pipe}, k=k, metrics=list(METRICS), seed=seed,
                            progress=False, arrays=arrays)  # fmt: skip
  ref_at = {q: i for i, q in enumerate(ref.question_ids)}
  ref_top = {q: list(ref.retrieved[PIPELINE][ref_at[q]]) for q in qids_all}
  hand = [pipeline_mod.knob_value(pipe, p) for p in FUSION_KNOBS]

  def rrf_here(q: str, values: Sequence[float]) -> list[str]:
    s = weighted_rrf([legs[leg][q] for leg in LEGS], values[:3], values[3])
    return ranked(s, position[episode_of[q]], k)

  eq_hand = sum(rrf_here(q, hand) == ref_top[q] for q in qids_all)
  fit_at = {q: i for i, q in enumerate(fit_res['per_question']['question_ids'])}
  fitted_pq = {m: np.asarray([fit_res['per_question']['fitted'][m][fit_at[q]] for q in qids_all]) for m in METRICS}
  hand_pq = {m: np.asarray([fit_res['per_question']['hand_set'][m][fit_at[q]] for q in qids_all]) for m in METRICS}
  ref_pq = {m: np.asarray(ref.scores[PIPELINE][m])[[ref_at[q] for q in qids_all]] for m in METRICS}
  if not all(np.array_equal(ref_pq[m], hand_pq[m]) for m in METRICS):
    raise EngramError(f'{args.fit_run}: its hand-set scores differ from the evaluation here')
  fit_top = {q: rrf_here(q, [fit_res['fitted'][episode_of[q]][p] for p in FUSION_KNOBS]) for q in qids_all}
  eq_fit = int(np.sum(np.isclose(scores_of(fit_top)['ndcg@10'], fitted_pq['ndcg@10'], rtol=0, atol=1e-9)))

  # 2. ranx per fold
  ranx_out = {}
  for method in RANX_METHODS:
    ranx_out[method] = ranx_folds(legs, qrels, episode_of, folds, method)

  # 3. our grid, cross-fitted (the first call: legs, compilation; the second: fusion and metrics only)
  cache = LegCache()
  grid_times = []
  for _ in range(2):
    t = time.perf_counter()
    g = grid.evaluate_grid(episodes, embeddings, pipe, GRID, k=k, metrics=list(METRICS), seed=seed, arrays=arrays,
                           leg_cache=cache)  # fmt: skip
    grid_times.append(time.perf_counter() - t)
  fold_of = {e: i for i, f in enumerate(folds) for e in f}
  g_at = {q: i for i, q in enumerate(g.question_ids)}
  sel = np.asarray([g_at[q] for q in qids_all])
  t = time.perf_counter()
  choice, chosen = evaluation.crossfit_choose(
    list(g.scores['ndcg@10'][:, sel]), [str(fold_of[episode_of[q]]) for q in qids_all], qids_all
  )
  choose_s = time.perf_counter() - t
  grid_pq = {m: g.scores[m][:, sel][choice, np.arange(len(sel))] for m in METRICS}

  # 4. the table
  pq = {
    f'{PIPELINE} hand-set (reference)': ref_pq,
    'ours: gradient fit (4 knobs)': fitted_pq,
    'ours: exhaustive grid (4 knobs)': grid_pq,
  }
  checks = {
    'export_vs_hand_set': {'equal': int(eq_hand), 'n': len(qids_all)},
    'export_vs_fitted': {'equal': eq_fit, 'n': len(qids_all)},
    'ranx_evaluate': {},
    'fits_identical': fit_runs.get('identical'),
  }
  for method, r in ranx_out.items():
    s = scores_of(r['fused'])
    pq[f'ranx optimize_fusion: {method}'] = s
    own = {m: np.asarray([r['ranx_scores'][q][m] for q in qids_all]) for m in METRICS}
    checks['ranx_evaluate'][method] = {
      'equal': int(np.sum(np.all([np.isclose(s[m], own[m], rtol=0, atol=1e-9) for m in METRICS], axis=0))),
      'n': len(qids_all),
    }
  names = list(pq)
  base = 'ours: gradient fit (4 knobs)'
  n_res = int(args.n_resamples)
  others = [n for n in names if n != base]
  pairs = stats.paired_tests(
    np.stack([pq[n][m] for n in others for m in METRICS]),
    np.stack([pq[base][m] for n in others for m in METRICS]),
    seed=seed,
    n_resamples=n_res,
  )
  paired = {n: {} for n in others}
  for (n, m), t_ in zip([(n, m) for n in others for m in METRICS], pairs):
    paired[n][m] = t_.to_dict()
  timing = fit_res['timing']
  times = {
    names[0]: {'text': '- (hand-set)'},
    base: {
      'fit_s': timing['fit_s'],
      'fit_per_fold_s': timing['fit_per_fold_s'],
      'text': f'{timing["fit_s"]:.1f} s',
    },
    'ours: exhaustive grid (4 knobs)': {
      'grid_s': grid_times,
      'choose_s': choose_s,
      'text': f'{grid_times[0]:.1f} s first call (legs, compilation), {grid_times[1]:.1f} s again; choice '
      f'{choose_s:.2f} s',
    },
  }
  if 'fit_again' in fit_runs:
    t2 = fit_runs['fit_again']['timing']
    times[base]['again'] = {'fit_s': t2['fit_s'], 'fit_per_fold_s': t2['fit_per_fold_s']}
    times[base]['runs'] = fit_runs
    times[base]['text'] += f'; again {t2["fit_s"]:.1f} s'
  for method, r in ranx_out.items():
    times[f'ranx optimize_fusion: {method}'] = {
      'first_call_s': r['first_call_s'],
      'optimise_s': r['optimise_s'],
      'fuse_s': r['fuse_s'],
      'text': f'{r["first_call_s"]:.1f} s first call (JIT + fold 1), then {sum(r["optimise_s"]):.1f} s for the 10 '
      f'folds (fuse {sum(r["fuse_s"]):.2f} s)',
    }
  methods = {}
  for n in names:
    methods[n] = {
      'summary': {m: stats.bootstrap_ci(pq[n][m], seed=seed, n_resamples=n_res).to_dict() for m in METRICS},
      'time': {kk: v for kk, v in times[n].items() if kk != 'text'},
      'time_text': times[n]['text'],
    }
    if n in paired:
      methods[n]['paired_vs_gradient'] = paired[n]
  methods[base]['params_by_fold'] = {','.join(f): fit_res['fitted'][f[0]] for f in folds}
  methods['ours: exhaustive grid (4 knobs)']['params_by_fold'] = {
    ','.join(folds[int(f)]): g.point(int(p)) for f, p in chosen.items()
  }
  for method, r in ranx_out.items():
    methods[f'ranx optimize_fusion: {method}']['params_by_fold'] = r['params']
  res = {
    'command': 'python -m experiments.research.ranx_fusion ' + ' '.join(argv if argv is not None else sys.argv[1:]),
    'fit_run': str(args.fit_run),
    'dataset': str(cfg.dataset.name),
    'embedder': str(cfg.embedder.get('model_id') or cfg.embedder.get('name')),
    'k': k,
    'seed': seed,
    'fold_seed': fit_config.seed,
    'folds': folds,
    'steps': int(fit_res['steps']),  # the gradient fit's Adam steps per fold
    'n_questions': len(qids_all),
    'legs': {
      leg.name: {
        'op': leg.op,
        'depth': leg.depth,
        'weight': leg.weight,
        'mean_listed': float(np.mean([len(legs[leg.name][q]) for q in qids_all])),
      }
      for leg in pipe.legs
    },  # fmt: skip
    'export_s': export_s,
    'files': files,
    'ranx': {
      'version': metadata.version('ranx'),
      'numba': metadata.version('numba'),
      'norm': RANX_NORM,
      'metric': 'ndcg@10',
      'grids': ranx_grid_sizes(),
      'numba_threads': numba_threads(),
    },
    'grid': {
      'axes': GRID,
      'points': int(g.n_points),
      'rule': 'crossfit_choose: best mean ndcg@10 on the other folds, ties to the first point',
    },  # fmt: skip
    'checks': checks,
    'methods': methods,
    'time_note': '',
    'per_question': {'question_ids': qids_all, **{n: {m: pq[n][m].tolist() for m in METRICS} for n in names}},
  }
  res['load'] = {'start': load_start, 'end': uptime()}
  res['time_note'] = (
    'Gradient fit: the fit phase of `experiments.fit` (its `results.json` timing.fit_s: the training rows, the soft '
    f'twin checks, compilation, {res["steps"]} steps per fold, the held-out scoring), '
    + ('run just before the rest, then again with its compiled programs cached' if fit_runs else f'`{args.fit_run}`')
    + ' (the folds run two at a time, one per CPU device). Grid: one `evaluate_grid` call over all points and '
    'questions, then again with the legs cached. ranx: the first `optimize_fusion` call (numba compiling into an '
    f"empty cache, then fold 1's search), then the {len(folds)} folds' calls; the "
    f'legs were exported once for all methods ({export_s:.1f} s) and turned into ranx Runs outside the timed calls; '
    f'numba threads: {res["ranx"]["numba_threads"]}.'
  )
  (out_dir / 'results.json').write_text(json.dumps(res, indent=1))
  shutil.rmtree(os.environ['NUMBA_CACHE_DIR'], ignore_errors=True)
  return write_tables(res, out_dir, args.docs)


def write_tables(res: dict[str, Any], out_dir: Path, docs: str | None) -> dict[str, Any]:
  """results.md in ``out_dir`` and, with ``docs``, the table between that page's markers; prints it."""
  text = markdown(res)
  (out_dir / 'results.md').write_text(text)
  if docs:
    page = Path(docs)
    page.write_text(replace_between(page.read_text(), f'\n{text}\n'))
  print(text)
  return res


if __name__ == '__main__':
  from experiments.lib import common

  common.plain_errors(main)()  # the project's errors as one line (ENGRAM_FULL_ERROR=1: traceback)
