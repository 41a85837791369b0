"""Issue 41's probes of run folders and fitted artifacts: a run folder is whole or refused (never two runs' files
read as one), an artifact checks its provenance (embedder, pipeline node, dimension, tensors), and ``collect``'s
refusals are one line naming the file. Each test fails on the code before the fix; the fault injection (a fit and
an evaluate rerun into a used folder, SIGKILLed at each of their writes in turn) is in the slow tier.

The run folders here are written by the library (:func:`engram_jax.fit.artifact.save`,
:mod:`engram_jax.core.runfolder`) as ``experiments.fit`` writes them, without fitting: a hand-set ``k0`` per fold."""

import contextlib
import io as io_
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from engram_jax.core import runfolder
from engram_jax.core.errors import EngramError
from engram_jax.data import io
from engram_jax.fit import Adapter, artifact
from engram_jax.fit.train import FitResult
from experiments import collect, compare, docs_site
from experiments import evaluate as evaluate_exp
from experiments import fit as fit_exp

ROOT = Path(__file__).resolve().parents[2]
CONF = str(ROOT / 'conf')
PIPE = 'rrf_cos_bm25'
try:
  HAVE = (io.resolve_data_root() / 'locomo' / 'locomo10.json').is_file()
except FileNotFoundError:
  HAVE = False
needs_data = pytest.mark.skipif(not HAVE, reason='LoCoMo not found under the data root')


def _compose(tmp_path, overrides=(), name='config'):
  with initialize_config_dir(config_dir=CONF, version_base='1.3'):
    return compose(
      config_name=name,
      overrides=[
        'embedder=hashing',
        'eval.n_resamples=100',
        'eval.progress=false',
        f'paths.cache_dir={tmp_path}/cache',
        *overrides,
      ],
    )


def _refused(call, match):
  """``call()`` raises an EngramError of one line matching ``match``; returns the message."""
  with pytest.raises(EngramError, match=match) as e:
    call()
  assert '\n' not in str(e.value)
  return str(e.value)


def _fit_run(tmp_path, run, *, final=True, adapter_dim=None, embedder_dim=256, scored=('conv-26', 'conv-30'), k0=30.0):
  """A finished fit's run folder as ``experiments.fit`` writes it (its files through runfolder, the marker last):
  one fold per episode of ``scored`` (``k0``, ``k0`` + 10, ...), a final fit with ``final``, an adapter of
  ``adapter_dim`` rows (rank 2) with ``adapter_dim``."""
  cfg = _compose(tmp_path, [f'embedder.encoder.dim={embedder_dim}', f'pipeline=[{PIPE}]'])
  folder = runfolder.begin(run, fit_exp.OUTPUTS)
  components = [Adapter(rank=2, lr_scale=0.1)] if adapter_dim else []
  labels = {f'fold_{i:02d}': [e] for i, e in enumerate(scored)}
  if final:
    labels['final'] = []
  fits = {}
  for i, label in enumerate(labels):
    learned = {}
    if adapter_dim:
      learned['adapter'] = {
        'u': np.zeros((adapter_dim, 2), np.float32),
        'v': np.full((adapter_dim, 2), 0.01, np.float32),
      }
    value = k0 + 10 * i
    fits[label] = FitResult({'k0': value}, [], 1, 0.0, raw={'k0': np.float32(np.log(value))}, learned=learned)
  episodes = list(scored)
  artifact.save(
    run / 'artifact' / 'fitted',
    pipe_name=PIPE,
    pipe_node=OmegaConf.to_container(cfg.pipeline[PIPE], resolve=True),
    params=['k0'],
    k=10,
    components=components,
    fits=fits,
    scored=labels,
    train_questions={label: [f'{e}/q' for e in episodes if e not in eps] for label, eps in labels.items()},
    train_episodes={label: [e for e in episodes if e not in eps] for label, eps in labels.items()},
    info={
      'embedder': OmegaConf.to_container(cfg.embedder, resolve=True),
      'embedder_dim': embedder_dim,
      'array_options': [PIPE],
    },
  )
  runfolder.write_file(run / 'artifact' / 'variants.json', json.dumps(['fitted']))
  ids = [f'q{i}' for i in range(6)]
  folder.write_files(
    {
      'fitted.json': json.dumps(
        {'pipeline': PIPE, 'folds': {e: fits[f'fold_{i:02d}'].values for i, e in enumerate(scored)}}
      ),
      'results.json': json.dumps(
        {
          'pipeline': PIPE,
          'metrics': ['ndcg@10'],
          'per_question': {'question_ids': ids, 'fitted': {'ndcg@10': [0.5] * 6}, 'hand_set': {'ndcg@10': [0.25] * 6}},
        }
      ),
      'config_resolved.yaml': 'dataset:\n  name: locomo\n',
    }
  )
  folder.finish()
  return run


def _eval_run(run, values, *, overrides=('eval.k=10',)):
  """A finished evaluate run (a multirun's job when ``overrides`` are given): ``.hydra/overrides.yaml``,
  ``results.json`` (one pipeline, ndcg@10 per question) and its marker."""
  (run / '.hydra').mkdir(parents=True, exist_ok=True)
  (run / '.hydra' / 'overrides.yaml').write_text(''.join(f'- {o}\n' for o in overrides))
  folder = runfolder.begin(run, evaluate_exp.OUTPUTS)
  ids = [f'q{i}' for i in range(len(values))]
  folder.write(
    'results.json',
    json.dumps(
      {
        'dataset': 'locomo',
        'n_questions': len(ids),
        'k': 10,
        'metrics': ['ndcg@10'],
        'pipelines': {'cosine': {'ndcg@10': float(np.mean(values)), 'ci95': {'ndcg@10': [0.0, 1.0]}}},
        'per_question': [{'id': q, 'scores': {'cosine': {'ndcg@10': float(v)}}} for q, v in zip(ids, values)],
      }
    ),
  )
  folder.finish()
  return run


def _readers(tmp_path, run):
  """Every reader of a fit's run folder, each a call: ``evaluate fitted=RUN``, ``evaluate fitted=RUN/fitted.json``
  (both up to where they read the folder: config checks and pipelines), ``compare RUN/results.json`` and
  ``load_artifact(RUN)``."""
  from experiments.lib import checks, common

  def evaluate_with(fitted):
    cfg = _compose(tmp_path, [f'pipeline=[{PIPE}]', f'fitted={fitted}'])
    checks.check_evaluate(cfg)
    common.build_pipelines(cfg)

  return {
    'evaluate fitted=RUN': lambda: evaluate_with(run),
    'evaluate fitted=RUN/fitted.json': lambda: evaluate_with(run / 'fitted.json'),
    'compare RUN/results.json': lambda: compare.read_rows(run / 'results.json', 1),
    'load_artifact(RUN)': lambda: artifact.load(run),
  }


# ---- a run folder is whole or refused --------------------------------------------------------------------------------


def test_a_whole_run_folder_is_read_by_every_reader(tmp_path):
  run = _fit_run(tmp_path, tmp_path / 'run')
  for call in _readers(tmp_path, run).values():
    call()
  marker = runfolder.check(run, ['fitted.json', 'artifact/fitted/manifest.json'])
  assert {'fitted.json', 'results.json', 'artifact/variants.json', 'artifact/fitted/final.safetensors'} <= set(
    marker['files']
  )


def test_a_run_folder_without_its_marker_is_refused_by_every_reader(tmp_path):
  """A fit killed before it finished (or a rerun that began) leaves no marker: each reader says so in one line."""
  run = _fit_run(tmp_path, tmp_path / 'run')
  (run / runfolder.MARKER).unlink()
  for what, call in _readers(tmp_path, run).items():
    _refused(call, rf'^incomplete or mixed run folder {run}: no run_complete.json \(the run that wrote it did not')


@pytest.mark.parametrize(
  'name', ['fitted.json', 'artifact/fitted/fold_00.safetensors', 'artifact/fitted/manifest.json']
)
def test_two_runs_files_in_one_folder_are_refused_by_every_reader(tmp_path, name):
  """The probe: a fit rerun into a used folder and killed at the manifest write left new results, fitted.json and
  safetensors beside the old manifest.json: ``fitted=RUN`` gave 0.3379, ``fitted=RUN/fitted.json`` 0.4117. A file
  that is not the one the marker vouches for is named, by every reader."""
  run = _fit_run(tmp_path, tmp_path / 'run')
  newer = _fit_run(tmp_path, tmp_path / 'newer', final=False, k0=35.0)
  shutil.copy(newer / name, run / name)
  for call in _readers(tmp_path, run).values():
    _refused(call, rf'^incomplete or mixed run folder {run}: file {name} does not match run_complete.json')


def test_overrides_rewritten_by_a_failed_rerun_are_refused(tmp_path):
  """A rerun into a used folder that failed (or was killed) before writing left its ``.hydra/overrides.yaml`` beside
  the old results: collect labelled the old numbers with the new overrides."""
  sweep = tmp_path / 'sweep'
  _eval_run(sweep / '0', np.linspace(0, 1, 12), overrides=['eval.k=10'])
  _eval_run(sweep / '1', np.linspace(1, 0, 12), overrides=['eval.k=5'])
  collect.collect(sweep, n_resamples=100)
  (sweep / '1' / '.hydra' / 'overrides.yaml').write_text('- eval.k=7\n')
  _refused(
    lambda: collect.collect(sweep, n_resamples=100),
    rf'^incomplete or mixed run folder {sweep / "1"}: file .hydra/overrides.yaml does not match run_complete.json',
  )
  _refused(lambda: compare.read_rows(sweep / '1' / 'results.json', 1), 'file .hydra/overrides.yaml does not match')
  _refused(lambda: docs_site.read_results(sweep / '1'), 'file .hydra/overrides.yaml does not match')


def test_docs_site_refuses_an_incomplete_run(tmp_path):
  run = _eval_run(tmp_path / 'run', np.linspace(0, 1, 12))
  assert docs_site.read_results(run)['n_questions'] == 12
  (run / runfolder.MARKER).unlink()
  _refused(lambda: docs_site.read_results(run), rf'^incomplete or mixed run folder {run}: no run_complete.json')
  proc = subprocess.run(
    [sys.executable, '-m', 'experiments.docs_site', 'check', 'default', str(run)],
    cwd=ROOT,
    capture_output=True,
    text=True,
    check=False,
  )
  assert proc.returncode == 1 and proc.stderr.count('\n') == 1, proc.stderr
  assert proc.stderr.startswith(f'Error: incomplete or mixed run folder {run}: no run_complete.json')


def test_a_rerun_removes_the_old_marker_first_then_what_it_replaces(tmp_path):
  """A rerun into a used folder with fewer variants left the old ``artifact/adapter`` beside the new fit; a fit
  without a final fit left the old ``final.safetensors``."""
  run = _fit_run(tmp_path, tmp_path / 'run', adapter_dim=256)
  shutil.copytree(run / 'artifact' / 'fitted', run / 'artifact' / 'adapter')
  (run / 'notes.txt').write_text('mine')
  (run / '.hydra').mkdir()
  (run / '.hydra' / 'overrides.yaml').write_text('- fit.steps=3\n')
  log = tmp_path / 'steps.log'
  os.environ[runfolder.FAULT_LOG_ENV] = str(log)
  try:
    runfolder.begin(run, fit_exp.OUTPUTS)
  finally:
    del os.environ[runfolder.FAULT_LOG_ENV]
  steps = [line.split('\t')[1] for line in log.read_text().splitlines()]
  assert steps[0] == str(run / runfolder.MARKER)  # first, before any other change
  assert sorted(p.name for p in run.iterdir()) == ['.hydra', 'notes.txt']
  _refused(lambda: artifact.load(run), 'no run_complete.json')


def test_an_evaluate_run_into_the_folder_it_applies_is_refused(tmp_path):
  run = _fit_run(tmp_path, tmp_path / 'run')
  for fitted in (run, run / 'fitted.json'):
    cfg = _compose(tmp_path, [f'pipeline=[{PIPE}]', f'fitted={fitted}'])
    _refused(lambda: evaluate_exp.run(cfg, run), rf'^fitted={fitted} lies in this run.s own output folder {run}')
  runfolder.check(run)  # untouched


def test_artifact_files_have_the_mode_of_every_other_file(tmp_path):
  """Artifact tensors were written 0600 (safetensors' temporary file), every other file 0644."""
  run = _fit_run(tmp_path, tmp_path / 'run')
  umask = os.umask(0o022)
  os.umask(umask)
  modes = {p.name: p.stat().st_mode & 0o777 for p in (run / 'artifact' / 'fitted').iterdir()}
  assert set(modes.values()) == {(run / 'results.json').stat().st_mode & 0o777, 0o666 & ~umask}, modes


# ---- artifacts carry and check their provenance ------------------------------------------------------------------


def test_an_artifact_of_another_embedder_is_refused(tmp_path):
  """A hashing-384 fit applied to a MiniLM run gave 0.4085 in a table labelled all-MiniLM-L6-v2; of another dimension
  it crashed inside JAX; a knob-only artifact of another embedder applied without a note."""
  run = _fit_run(tmp_path, tmp_path / 'run')  # hashing, 256 dimensions
  from experiments.lib import fit_artifact

  for overrides, diff in [
    (['embedder.encoder.dim=384'], 'encoder.dim: 384 here, 256 in the artifact; model_id: .hashing-384. here'),
    (['embedder=minilm'], "these vectors are of 'all-MiniLM-L6-v2'"),
  ]:
    cfg = _compose(tmp_path, [f'pipeline=[{PIPE}]', f'fitted={run}', *overrides])
    _refused(
      lambda cfg=cfg: fit_artifact.check(cfg),
      rf"^fitted={run}: the artifact was fitted on embeddings of 'hashing-256', .*{diff}.*fitted_force=true",
    )
  fit_artifact.check(_compose(tmp_path, [f'pipeline=[{PIPE}]', f'fitted={run}', 'fitted_force=true', *overrides]))


def test_a_leg_override_the_artifact_would_drop_is_refused(tmp_path):
  """``++pipeline.rrf_cos_bm25.legs.cos.depth=50 fitted=RUN`` gave 0.3379 with or without the override while
  config_resolved.yaml said depth 50; ``fitted=RUN/fitted.json`` applies it (0.3115)."""
  from experiments.lib import common

  run = _fit_run(tmp_path, tmp_path / 'run')
  depth = f'++pipeline.{PIPE}.legs.cos.depth=50'
  cfg = _compose(tmp_path, [f'pipeline=[{PIPE}]', f'fitted={run}', depth])
  _refused(
    lambda: evaluate_exp.run(cfg, tmp_path / 'out'),
    rf'^fitted={run}: pipeline {PIPE} differs from the pipeline the artifact applies \(legs.cos.depth: 50 here, '
    r'unset in the artifact\): the artifact would apply its own and drop this run.s',
  )
  from experiments.lib import fit_artifact

  fit_artifact.check(_compose(tmp_path, [f'pipeline=[{PIPE}]', f'fitted={run}', depth, 'fitted_force=true']))
  pipes, _ = common.build_pipelines(_compose(tmp_path, [f'pipeline=[{PIPE}]', f'fitted={run}/fitted.json', depth]))
  assert [p.leg('cos').depth for n, p in pipes.items() if n.startswith(f'{PIPE}[fold=')] == [50, 50]


def _standalone(tmp_path):
  run = _fit_run(tmp_path, tmp_path / 'run')
  art = tmp_path / 'standalone'
  shutil.copytree(run / 'artifact' / 'fitted', art)
  return art


def _edit_manifest(art, edit):
  manifest = json.loads((art / 'manifest.json').read_text())
  edit(manifest)
  (art / 'manifest.json').write_text(json.dumps(manifest))


def test_damaged_artifact_files_are_named(tmp_path):
  """SafetensorError, KeyError: 'pipeline' and JSONDecodeError came without the file's name; tensor shapes in the
  manifest were never checked."""
  art = _standalone(tmp_path)
  artifact.load(art)
  tensors = art / 'fold_00.safetensors'
  good = tensors.read_bytes()
  tensors.write_bytes(good[:40] + b'\0' * (len(good) - 40))
  _refused(lambda: artifact.load(art), rf'^{tensors}: its bytes do not match the sha256 in manifest.json')
  _edit_manifest(art, lambda m: [e.pop('sha256') for e in m['fits']])  # an artifact from before the sha256
  _refused(lambda: artifact.load(art), rf'^{tensors}: not a readable safetensors file \(SafetensorError')
  tensors.write_bytes(good)
  _edit_manifest(art, lambda m: m['fits'][0]['tensors']['knobs/k0'].update(shape=[3]))
  _refused(lambda: artifact.load(art), rf'^{tensors}: tensor knobs/k0 is float32\[1\], manifest.json says float32\[3\]')
  _edit_manifest(art, lambda m: m.pop('pipeline'))
  manifest = art / 'manifest.json'
  _refused(lambda: artifact.load(art), rf"^{manifest}: a damaged artifact manifest \(KeyError: 'pipeline'")
  manifest.write_text(manifest.read_text()[:100])
  _refused(lambda: artifact.load(art), rf'^{manifest}: not a readable artifact manifest \(JSONDecodeError')
  cfg = _compose(tmp_path, [f'pipeline=[{PIPE}]', f'fitted={art}'])
  _refused(lambda: evaluate_exp.run(cfg, tmp_path / 'out'), rf'^{manifest}: not a readable artifact manifest')


def test_a_damaged_file_in_a_run_folder_is_named(tmp_path):
  run = _fit_run(tmp_path, tmp_path / 'run')
  (run / 'artifact' / 'fitted' / 'fold_01.safetensors').write_bytes(b'{')
  _refused(
    lambda: artifact.load(run),
    rf'^incomplete or mixed run folder {run}: file artifact/fitted/fold_01.safetensors does not match',
  )
  (run / 'artifact' / 'variants.json').write_text('[')
  _refused(lambda: artifact.load(run), 'file artifact/fitted/fold_01.safetensors does not match')


def test_an_artifact_for_a_pipeline_not_selected_is_one_line(tmp_path):
  run = _fit_run(tmp_path, tmp_path / 'run')
  cfg = _compose(tmp_path, ['pipeline=[cosine]', f'fitted={run}'])
  _refused(
    lambda: evaluate_exp.run(cfg, tmp_path / 'out'),
    rf"^fitted={run}: the artifact is for pipeline '{PIPE}', which is not selected",
  )


@needs_data
def test_an_artifact_without_a_final_fit_on_a_new_conversation_is_one_line_before_embedding(tmp_path, monkeypatch):
  """Also when the dataset was loaded before in this process (the load is memoized; its checks must not be)."""
  run = _fit_run(tmp_path, tmp_path / 'run', final=False, scored=('conv-30', 'conv-41'))
  _refused(lambda: artifact.load(run).fit_for('conv-26'), 'is in none of its folds and the artifact has no final')
  from engram_jax.eval import evaluation

  one = "dataset.loader.conversations=['conv-26']"
  evaluate_exp.run(_compose(tmp_path, ['pipeline=[bm25]', one]), tmp_path / 'first')  # conv-26 loaded (memoized)
  monkeypatch.setattr(evaluation, 'embed_episodes', lambda *a, **k: pytest.fail('embedded before the refusal'))
  cfg = _compose(tmp_path, [f'pipeline=[{PIPE}]', f'fitted={run}', one])
  _refused(
    lambda: evaluate_exp.run(cfg, tmp_path / 'out'),
    rf'^fitted={run}: episodes conv-26 of dataset locomo are in none of its folds and the artifact has no final fit',
  )


@pytest.mark.slow
@needs_data
def test_fitted_force_applies_and_records_what_differed(tmp_path):
  run = _fit_run(tmp_path, tmp_path / 'run')
  depth = f'++pipeline.{PIPE}.legs.cos.depth=50'
  cfg = _compose(
    tmp_path,
    [f'pipeline=[{PIPE}]', f'fitted={run}', 'embedder.encoder.dim=384', depth, 'fitted_force=true',
     "dataset.loader.conversations=['conv-26']"],
  )  # fmt: skip
  res = evaluate_exp.run(cfg, tmp_path / 'out')
  forced = res['fitted_artifact']['forced']
  assert [w.split(' (')[0] for w in forced] == [
    f'pipeline {PIPE} differs from the pipeline the artifact applies',
    "the artifact was fitted on embeddings of 'hashing-256', these vectors are of 'hashing-384'",
    'the artifact was fitted on 256-dimensional vectors, these are 384-dimensional',
  ]
  assert (
    'Applied with fitted_force=true although the artifact was fitted on 256-dimensional'
    in (tmp_path / 'out' / 'results.md').read_text()
  )
  adapter = _fit_run(tmp_path, tmp_path / 'adapter', adapter_dim=256)
  cfg = _compose(
    tmp_path,
    [f'pipeline=[{PIPE}]', f'fitted={adapter}', 'embedder.encoder.dim=384', 'fitted_force=true',
     "dataset.loader.conversations=['conv-26']"],
  )  # fmt: skip
  _refused(
    lambda: evaluate_exp.run(cfg, tmp_path / 'out2'),
    rf'^fitted={adapter}: the artifact was fitted on 256-dimensional vectors, these are 384-dimensional; its '
    'adapter cannot apply to them',
  )


# ---- collect: one line naming the file -----------------------------------------------------------------------------


def test_collect_refuses_a_truncated_job_file_naming_it(tmp_path):
  """A truncated results.json aborted the whole collection with a JSONDecodeError that named no file."""
  sweep = tmp_path / 'sweep'
  _eval_run(sweep / '0', np.linspace(0, 1, 12), overrides=['eval.k=10'])
  job = _eval_run(sweep / '1', np.linspace(1, 0, 12), overrides=['eval.k=5'])
  text = (job / 'results.json').read_text()
  (job / 'results.json').write_text(text[: len(text) // 2])
  _refused(
    lambda: collect.main([str(sweep), '--n-resamples', '100']),
    rf'^incomplete or mixed run folder {job}: file results.json does not match run_complete.json',
  )
  (job / runfolder.MARKER).unlink()  # a job killed between its results and its marker, or written before markers
  _refused(lambda: collect.main([str(sweep), '--n-resamples', '100']), rf'^incomplete or mixed run folder {job}: no')


def test_collect_refuses_a_grid_multirun(tmp_path):
  """A grid multirun's jobs were each "failed or running"."""
  sweep = tmp_path / 'sweep'
  for n in range(2):
    (sweep / str(n) / '.hydra').mkdir(parents=True)
    (sweep / str(n) / '.hydra' / 'overrides.yaml').write_text(f"- '+grid={{k0: [{n}, 60]}}'\n")
    (sweep / str(n) / 'grid.json').write_text('{}')
  _refused(
    lambda: collect.main([str(sweep), '--n-resamples', '100']),
    rf'^{sweep / "0"}: a grid job \(grid.json, no results.json\): collect reads experiments.evaluate jobs',
  )


def test_collect_refuses_a_plain_run_folder(tmp_path):
  run = _eval_run(tmp_path / 'run', np.linspace(0, 1, 12))
  _refused(
    lambda: collect.main([str(run), '--n-resamples', '100']),
    rf'^{run} is a single run folder, not a multirun .*python -m experiments.compare {run}/results.json',
  )
  proc = subprocess.run(
    [sys.executable, '-m', 'experiments.collect', str(run)], cwd=ROOT, capture_output=True, text=True, check=False
  )
  assert proc.returncode == 1 and proc.stderr.count('\n') == 1, proc.stderr
  assert proc.stderr.startswith(f'Error: {run} is a single run folder, not a multirun')


# ---- fault injection: a rerun into a used folder, killed at each of its writes ------------------------------------


def _cli(module, args, env=None, timeout=600):
  return subprocess.run(
    [sys.executable, '-m', module, *args],
    cwd=ROOT,
    env={**os.environ, 'JAX_PLATFORMS': 'cpu', **(env or {})},
    capture_output=True,
    text=True,
    timeout=timeout,
    check=False,
  )


def describe(name, value):
  if name == 'collect SWEEP' and value.get('missing'):
    return f'reads the other jobs, lists job {value["missing"]} as failed or running'
  return 'reads the old run'


def _outcome(call):
  """``('reads', value)`` or ``('refused', the one-line message)``."""
  try:
    return 'reads', call()
  except EngramError as e:
    assert '\n' not in str(e)
    return 'refused', str(e)


FIT = [
  'embedder=hashing',
  'dataset.loader.conversations=[conv-30,conv-26]',
  f'pipeline=[{PIPE}]',
  'fit.folds=2',
  'fit.batch_size=16',
  'fit.baselines=[cosine]',
  'fit.gap_checks=0',
  'eval.n_resamples=100',
  'eval.progress=false',
]


def _files(folder: Path) -> dict[str, bytes]:
  """Every file under ``folder`` by relative path, but its logs (timestamped lines) and the lock (the holder's
  pid): what a reader of the folder reads."""
  return {
    p.relative_to(folder).as_posix(): p.read_bytes()
    for p in sorted(folder.rglob('*'))
    if p.is_file() and p.suffix != '.log' and p.name != runfolder.LOCK
  }


def _restore(src: Path, run: Path) -> None:
  shutil.rmtree(run)
  shutil.copytree(src, run, symlinks=True)


def _kill_at_each_write(module, run, args, readers, tmp_path, *, also=lambda name, value, old: False, kills=3):
  """Rerun ``module args`` into the used folder ``run`` once, the folder copied just before each of its steps that
  change it (:data:`engram_jax.core.runfolder.FAULT_SNAPSHOT_ENV`: the folder a SIGKILL before that step leaves);
  ``kills`` of those steps (the first, the last and ones between) are also killed for real
  (:data:`engram_jax.core.runfolder.FAULT_ENV`) and must leave the files of their copy (the same paths; the bytes
  differ by the timings written), which each reader reads or refuses alike. Then each copy in turn is put in
  ``run``: every reader must refuse in one line, read what it read of the old run, or give a value ``also`` accepts
  (collect: the job listed as failed or running). Returns one record per step: ``(step, path, {reader: outcome})``,
  the readers' outcomes on the old run and on the finished rerun."""
  old, snaps, log = tmp_path / 'old_copy', tmp_path / 'snapshots', tmp_path / 'steps.log'
  shutil.copytree(run, old, symlinks=True)
  before = {name: _outcome(call) for name, call in readers.items()}
  assert all(kind == 'reads' for kind, _ in before.values()), before
  env = {runfolder.FAULT_SNAPSHOT_ENV: f'{run}{os.pathsep}{snaps}', runfolder.FAULT_LOG_ENV: str(log)}
  proc = _cli(module, [*args, f'hydra.run.dir={run}'], env)
  assert proc.returncode == 0, proc.stderr[-3000:]
  after = {name: _outcome(call) for name, call in readers.items()}
  steps = [(int(n), Path(path)) for n, path in (line.split('\t') for line in log.read_text().splitlines())]
  assert [n for n, _ in steps] == list(range(1, len(steps) + 1)) and len(steps) >= kills
  for n in sorted({round(1 + i * (len(steps) - 1) / (kills - 1)) for i in range(kills)}):
    _restore(old, run)
    proc = _cli(module, [*args, f'hydra.run.dir={run}'], {runfolder.FAULT_ENV: str(n)})
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    killed = _files(run)
    assert sorted(killed) == sorted(_files(snaps / f'{n:03d}')), (
      f'a kill before step {n} left other files than its copy'
    )
    seen = {name: _outcome(call)[0] for name, call in readers.items()}
    _restore(snaps / f'{n:03d}', run)
    assert seen == {name: _outcome(call)[0] for name, call in readers.items()}, (n, seen)
  records = []
  for n, path in steps:
    _restore(snaps / f'{n:03d}', run)
    got = {name: _outcome(call) for name, call in readers.items()}
    for name, (kind, value) in got.items():
      assert kind == 'refused' or value == before[name][1] or also(name, value, before[name][1]), (n, path, name, value)
    records.append((n, path.relative_to(run).as_posix(), got))
  return records, before, after


@pytest.mark.slow
@needs_data
def test_a_fit_killed_at_each_write_into_a_used_folder_leaves_a_folder_every_reader_refuses(tmp_path, capsys):
  """The probe reproduced: a fit rerun into a used folder (other settings) killed at each of its writes in turn."""
  run = tmp_path / 'run'
  old = _cli('experiments.fit', [*FIT, 'fit.steps=2', 'fit.final=true', f'hydra.run.dir={run}'])
  assert old.returncode == 0, old.stderr[-3000:]

  def scores(fitted):
    cfg = _compose(
      tmp_path, [f'pipeline=[{PIPE}]', f'fitted={fitted}', 'dataset.loader.conversations=[conv-30,conv-26]']
    )
    with contextlib.redirect_stdout(io_.StringIO()):  # its table: not in the fault report
      res = evaluate_exp.run(cfg, tmp_path / 'eval')
    return [q['scores'][PIPE]['ndcg@10'] for q in res['per_question']]

  readers = {
    'evaluate fitted=RUN': lambda: scores(run),
    'evaluate fitted=RUN/fitted.json': lambda: scores(run / 'fitted.json'),
    'compare RUN/results.json': lambda: [r.scores for r in compare.read_rows(run / 'results.json', 1)],
    'load_artifact(RUN)': lambda: {k: f.values for k, f in artifact.load(run).fits.items()},
  }
  records, before, after = _kill_at_each_write(
    'experiments.fit', run, [*FIT, 'fit.steps=3', 'fit.final=false'], readers, tmp_path
  )
  written = [path for _, path, _ in records]
  assert written[0] == runfolder.MARKER and written[-1] == runfolder.MARKER  # removed first, written last
  assert {'fitted.json', 'results.json', 'artifact/fitted/manifest.json', 'artifact/fitted/fold_00.safetensors'} < set(
    written
  )
  assert (
    all(kind == 'reads' for kind, _ in after.values()) and after['load_artifact(RUN)'] != before['load_artifact(RUN)']
  )
  with capsys.disabled():
    print(f'\nfit rerun into a used folder, killed before each of its {len(records)} steps:')
    for n, path, got in records:
      said = {name: value if kind == 'refused' else describe(name, value) for name, (kind, value) in got.items()}
      print(f'{n:2d} {path}: ' + json.dumps(said).replace(str(run), 'RUN'))


@pytest.mark.slow
@needs_data
def test_an_evaluate_job_killed_at_each_write_leaves_a_folder_collect_and_compare_refuse(tmp_path, capsys):
  sweep = tmp_path / 'sweep'
  args = ['embedder=hashing', 'dataset.loader.conversations=[conv-26]', 'eval.progress=false']
  proc = _cli('experiments.evaluate', ['-m', *args, 'pipeline=[cosine],[bm25]', f'hydra.sweep.dir={sweep}'])
  assert proc.returncode == 0, proc.stderr[-3000:]
  job = sweep / '1'

  def table(t):
    return {
      'rows': {f'{r["job"]}/{r["pipeline"]}': r['mean'] for r in t['rows']},
      'missing': [m['job'] for m in t['missing']],
    }

  readers = {
    'collect SWEEP': lambda: table(collect.collect(sweep, n_resamples=100)),
    'compare JOB/results.json': lambda: [r.scores for r in compare.read_rows(job / 'results.json', 1)],
    'docs_site check NAME JOB': lambda: docs_site.read_results(job)['pipelines'],
  }

  def job_missing(name, value, old):  # a job without results.json: listed as failed or running, the others as before
    rows = {k: v for k, v in old['rows'].items() if not k.startswith('1/')}
    return name == 'collect SWEEP' and value == {'rows': rows, 'missing': ['1']}

  records, before, after = _kill_at_each_write(
    'experiments.evaluate', job, [*args, 'pipeline=[cosine]'], readers, tmp_path, also=job_missing
  )
  assert [p for _, p, _ in records][:1] == [runfolder.MARKER] and records[-1][1] == runfolder.MARKER
  assert after['collect SWEEP'][0] == 'reads' and after['collect SWEEP'] != before['collect SWEEP']
  with capsys.disabled():
    print(f'\nevaluate job rerun into a used folder, killed before each of its {len(records)} steps:')
    for n, path, got in records:
      said = {name: value if kind == 'refused' else describe(name, value) for name, (kind, value) in got.items()}
      print(f'{n:2d} {path}: ' + json.dumps(said).replace(str(job), 'JOB'))
