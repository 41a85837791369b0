"""A cross-fit's folds run concurrently on several devices (one thread per device) with the sequential results, and
the entry points' ``eval.cpu_devices`` (how many CPU devices a process gets).

JAX fixes its device count before its first computation, so the two-device case runs in a fresh process with
``jax_num_cpu_devices = 2``.
"""

import textwrap

import pytest
from omegaconf import OmegaConf
from run_script import script_result

from engram_jax.core.errors import EngramError
from engram_jax.data import io
from experiments.lib import common

try:
  HAVE = (io.resolve_data_root() / 'locomo' / 'locomo10.json').is_file()
except FileNotFoundError:
  HAVE = False

SCRIPT = textwrap.dedent("""
  import json
  import jax
  jax.config.update('jax_num_cpu_devices', 2)
  import numpy as np, optax
  from engram_jax.fit import Folds, Schedule, build_rows, crossfit, episode_folds, make_problem
  from engram_jax.testing.synthetic import toy_fit_data

  assert jax.device_count() == 2, jax.devices()
  episodes, embeddings, arrays, pipe = toy_fit_data()
  problem, knobs, fixed = make_problem(pipe, ['legs.bm25.weight', 'legs.cos.weight', 'k0'])
  rows = build_rows(problem, pipe, episodes, arrays, seed=0)
  split = Folds([ep.id for ep in episodes for _ in ep.questions], [q.id for ep in episodes for q in ep.questions],
                episode_folds([ep.id for ep in episodes], n_folds=2))
  schedule = Schedule(optax.adam(0.1), steps=6, batch_size=8, monitor_steps=(0, 3, 6))
  kw = dict(monitor=lambda f, train: (lambda t, s, v: {'fold': f, 'w': float(v['legs.bm25.weight'])}))
  seen = []
  one = crossfit(problem, knobs, fixed, rows, split, schedule, **kw)
  two = crossfit(problem, knobs, fixed, rows, split, schedule, devices=jax.devices(), log=seen.append, **kw)
  plain = lambda r: {'values': r.values, 'losses': r.losses, 'monitor': r.monitor,
                     'raw': {k: np.asarray(v).tolist() for k, v in r.raw.items()}}
  print('RESULT ' + json.dumps({'one': [plain(r) for r in one], 'two': [plain(r) for r in two], 'log': seen}))
""")


@pytest.mark.slow
def test_folds_on_two_devices_equal_the_sequential_cross_fit():
  out = script_result(SCRIPT)
  assert len(out['one']) == len(out['two']) == 2
  assert out['two'] == out['one']  # knob values, every loss, raw parameters and monitors, bit for bit
  assert out['one'][0]['values'] != out['one'][1]['values']  # the folds differ: the comparison can fail
  assert sorted(l.split(' (')[0] for l in out['log']) == ['knobs fold 0', 'knobs fold 1']


# The fit entry point with its gap monitor (soft and hard halves, the shared step-0 pass, the rows copied to each
# fold's device) on two devices and on one: the same results.
FIT_SCRIPT = textwrap.dedent("""
  import json, sys, tempfile
  from pathlib import Path
  import jax
  jax.config.update('jax_num_cpu_devices', 2)
  from hydra import compose, initialize_config_dir
  from experiments import fit as fit_exp

  out = {}
  with tempfile.TemporaryDirectory() as tmp:
    for devices in ('null', '1'):
      with initialize_config_dir(config_dir=str(Path('conf').resolve()), version_base='1.3'):
        cfg = compose(config_name='fit', overrides=[
          'embedder=hashing', 'dataset.loader.conversations=[conv-30,conv-26]', 'pipeline=rrf_cos_bm25',
          'fit.folds=2', 'fit.steps=4', 'fit.batch_size=16', 'eval.n_resamples=100', 'eval.progress=false',
          'fit.baselines=[cosine]', f'paths.cache_dir={tmp}/cache', f'eval.devices={devices}'])
      res = fit_exp.run(cfg, Path(tmp) / devices)
      out[devices] = {'gap': res['soft_hard_gap'], 'fitted': res['fitted'], 'per_question': res['per_question']}
  print('RESULT ' + json.dumps(out))
""")


@pytest.mark.slow
@pytest.mark.skipif(not HAVE, reason='LoCoMo not found under the data root')
def test_the_fit_and_its_gap_monitor_on_two_devices_equal_one_device():
  out = script_result(FIT_SCRIPT)
  assert out['null']['gap']['by_step'] and len(out['null']['gap']['per_fold']) == 2
  assert out['null'] == out['1']  # the gap table, the fitted knobs and every out-of-fold score, bit for bit


def test_cpu_devices_setting():
  assert common.cpu_devices_wanted('cores', 2) == 2
  assert common.cpu_devices_wanted('cores', 64) == common.MAX_CPU_DEVICES
  assert common.cpu_devices_wanted('cores', None) == 1
  assert common.cpu_devices_wanted(3, 2) == 3
  for bad in (0, -1, True, 'all', 1.5):
    with pytest.raises(EngramError, match='eval.cpu_devices'):
      common.cpu_devices_wanted(bad, 2)
  # JAX is initialised in a test process (tests/conftest.py): the setting is kept, not changed, and says so
  two = common.eval_settings(OmegaConf.create({'eval': {'cpu_devices': 2}}))
  assert common.use_cpu_cores(two) is None
  assert common.use_cpu_cores(two, multirun=True) is None
