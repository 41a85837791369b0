"""No fit hangs on two CPU devices (issue 41, item 0).

The cause: jaxlib 0.10's CPU LAPACK kernels (Cholesky, LU, QR, triangular solves, ...) split a batch of matrices
across XLA's intra-op thread pool and block a pool thread until the pieces are done. A cross-fit runs its folds on
two CPU devices at once, each program on one pool thread; when both reach such a kernel together, each holds a pool
thread waiting for pieces queued behind the other (gdb: both ``tf_XLAEigen`` threads in
``jax::ParallelBatchMap -> BlockingCounter::Wait`` under ``lapack_spotrf_ffi``, every thread asleep). The query
adapter's implicit CFS-R gradient was the one LAPACK call of the project (``cho_solve`` in the KKT solve).

The fix: the KKT solve is a Cholesky in plain XLA loops (:func:`engram_jax.ops.nnls_implicit.spd_solve`), so no fit
step calls LAPACK; and :func:`engram_jax.fit.crossfit` lowers its step before starting the fold threads and runs
the folds one after another when the step calls a LAPACK kernel (an out-of-tree operator may), saying why.
"""

import textwrap

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from run_script import script_result

from engram_jax import fit
from engram_jax.data import io
from engram_jax.fit import adapter as A
from engram_jax.fit import train
from engram_jax.ops import nnls_implicit

try:
  HAVE = (io.resolve_data_root() / 'locomo' / 'locomo10.json').is_file()
except FileNotFoundError:
  HAVE = False


@given(st.integers(1, 12), st.integers(0, 2**31 - 1), st.floats(1e-3, 1.0))
def test_spd_solve_equals_numpy(p, seed, lam):
  rng = np.random.default_rng(seed)
  c = rng.normal(size=(p, 5))
  c /= np.linalg.norm(c, axis=1, keepdims=True)
  m = c @ c.T + lam * np.eye(p)
  rhs = rng.normal(size=p)
  got = np.asarray(jax.jit(nnls_implicit.spd_solve)(jnp.asarray(m), jnp.asarray(rhs)))
  np.testing.assert_allclose(got, np.linalg.solve(m, rhs), rtol=1e-6, atol=1e-8 / lam)


def test_spd_solve_batches_under_vmap():
  rng = np.random.default_rng(0)
  c = rng.normal(size=(4, 6, 3))
  m = np.einsum('bpd,bqd->bpq', c, c) + 0.1 * np.eye(6)
  rhs = rng.normal(size=(4, 6))
  got = np.asarray(jax.jit(jax.vmap(nnls_implicit.spd_solve))(jnp.asarray(m), jnp.asarray(rhs)))
  np.testing.assert_allclose(got, np.linalg.solve(m, rhs[..., None])[..., 0], rtol=1e-6, atol=1e-8)


def _adapter_step():
  """The adapter fit's jitted step with the implicit CFS-R gradient (the configuration that hung), lowered."""
  from engram_jax.eval.pipeline import make_pipeline
  from engram_jax.testing.synthetic import toy_fit_data

  episodes, _, arrays, _ = toy_fit_data()
  legs = {'cos': {'op': 'cosine'}, 'bm25': {'op': 'bm25'}, 'cfsr': {'op': 'cfsr', 'pool': 12, 'iterations': 20}}
  pipe = make_pipeline(legs=legs, fusion='rrf', name='stack')
  settings = fit.Settings(cfsr_grad='implicit')
  problem, knobs, fixed = fit.make_problem(pipe, ['legs.cos.weight', 'legs.cfsr.lam', 'k0'], settings=settings)
  rows = fit.build_rows(problem, pipe, episodes, arrays, seed=0)
  adapter = A.Adapter(rank=2, lr_scale=0.1)
  inputs = {'adapter': A.build_inputs(episodes, arrays)}
  grouped = train.group_optimizer(__import__('optax').adam(0.05), [adapter])
  step = train.make_step(problem, grouped, max_gold=train.max_gold_of(rows), components=[adapter])
  state = train.init_state(knobs, grouped, components=[adapter], inputs=inputs, seed=0)
  fixed_j = {p: jnp.asarray(v, jnp.float32) for p, v in fixed.items()}
  idx, w = jnp.arange(8), jnp.ones(8, jnp.float32)
  return step.lower(state, fixed_j, rows, inputs, idx, w, jnp.float32(1.0)).as_text()


def test_the_adapter_step_calls_no_lapack_kernel(monkeypatch):
  assert train.host_blocking_kernels(_adapter_step()) == []
  # the check can fail: with the LAPACK Cholesky the KKT solve used before, the same step calls it
  lapack = lambda m, rhs: jax.scipy.linalg.cho_solve(jax.scipy.linalg.cho_factor(m, lower=True), rhs)
  monkeypatch.setattr(nnls_implicit, 'spd_solve', lapack)
  assert any('potrf' in k for k in train.host_blocking_kernels(_adapter_step()))


# The configuration of the hanging fit (LoCoMo conv-26 + conv-30, hashing embedder, the CFS-R stack, the
# rank-2 adapter with the implicit gradient) on two CPU devices, cross-fitted ROUNDS times in one process (compiled
# once), each round's fitted values equal to the sequential run's. Before the fix 8 of 10 such fits hung.
HANG_SCRIPT = textwrap.dedent("""
  import json, sys, tempfile
  from pathlib import Path
  import jax
  jax.config.update('jax_num_cpu_devices', 2)
  import numpy as np
  from hydra import compose, initialize_config_dir
  from engram_jax import fit
  from engram_jax.eval import pipeline
  from experiments import fit as fit_exp
  from experiments.lib import common, fit_setup

  ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else ROUNDS_DEFAULT
  with tempfile.TemporaryDirectory() as tmp:
    with initialize_config_dir(config_dir=str(Path('conf').resolve()), version_base='1.3'):
      cfg = compose(config_name='fit', overrides=[
        'embedder=hashing', 'dataset.loader.conversations=[conv-26,conv-30]', 'pipeline=rrf_cos_bm25_cfsr',
        'fit.folds=2', 'fit.steps=3', 'fit.batch_size=16', 'fit.gap_checks=0', 'fit.check_twins=false',
        'fit.params=[legs.cos.weight,legs.cfsr.lam,k0]', 'fit.adapter={rank: 2, lr_scale: 0.1, cfsr_grad: implicit}',
        'eval.progress=false', f'paths.cache_dir={tmp}/cache'])
    name = list(cfg.pipeline)[0]
    pipe = common.hand_set_pipeline(name, cfg.pipeline[name])
    plan = fit_setup.build(cfg, pipe, name)
    data = fit_exp.load(cfg, fit_setup.read(cfg, name), pipeline.build_options([pipe]))
    problem, components = plan.variants()['adapter']
    rows = fit_setup.rows(plan, pipe, data.episodes, data.arrays, seed=0, problem=problem)
    inputs = {c.name: c.inputs(problem, data.episodes, data.arrays) for c in components}
    split = fit.Folds([e.id for e in data.episodes for _ in e.questions],
                      [q.id for e in data.episodes for q in e.questions], data.folds)
    kw = dict(components=components, inputs=inputs)
    knobs, fixed, schedule = plan.knobs, plan.every, plan.schedule()
    ref = [r.values for r in fit.crossfit(problem, knobs, fixed, rows, split, schedule, **kw)]
    logs = []
    for r in range(ROUNDS):
      two = [x.values for x in fit.crossfit(problem, knobs, fixed, rows, split, schedule, devices=jax.devices(), log=logs.append, **kw)]
      assert two == ref, (r, two, ref)
      print('round', r, flush=True)
  print('RESULT ' + json.dumps({'rounds': ROUNDS, 'sequential': any('one after another' in l for l in logs)}))
""")


@pytest.mark.slow
@pytest.mark.skipif(not HAVE, reason='LoCoMo not found under the data root')
def test_the_adapter_fit_on_two_devices_never_hangs():
  out = script_result(HANG_SCRIPT.replace('ROUNDS_DEFAULT', '6'), timeout=600)
  assert out == {'rounds': 6, 'sequential': False}  # concurrent folds (no LAPACK call), every round finished


# crossfit's guard: a step that calls a LAPACK kernel (here the KKT solve put back on cho_solve) runs its folds one
# after another on two devices, says so, and gives the sequential results
GUARD_SCRIPT = textwrap.dedent("""
  import json
  import jax
  jax.config.update('jax_num_cpu_devices', 2)
  import jax.numpy as jnp, optax
  from engram_jax import fit
  from engram_jax.eval.pipeline import make_pipeline
  from engram_jax.fit import adapter as A
  from engram_jax.ops import nnls_implicit
  from engram_jax.testing.synthetic import toy_fit_data

  nnls_implicit.spd_solve = lambda m, rhs: jax.scipy.linalg.cho_solve(jax.scipy.linalg.cho_factor(m, lower=True), rhs)
  episodes, _, arrays, _ = toy_fit_data()
  legs = {'cos': {'op': 'cosine'}, 'bm25': {'op': 'bm25'}, 'cfsr': {'op': 'cfsr', 'pool': 12, 'iterations': 20}}
  pipe = make_pipeline(legs=legs, fusion='rrf', name='stack')
  problem, knobs, fixed = fit.make_problem(pipe, ['legs.cos.weight', 'legs.cfsr.lam', 'k0'],
                                           settings=fit.Settings(cfsr_grad='implicit'))
  rows = fit.build_rows(problem, pipe, episodes, arrays, seed=0)
  split = fit.Folds([ep.id for ep in episodes for _ in ep.questions], [q.id for ep in episodes for q in ep.questions],
                    fit.episode_folds([ep.id for ep in episodes], n_folds=2))
  schedule = fit.Schedule(optax.adam(0.05), steps=2, batch_size=8)
  kw = dict(components=[A.Adapter(rank=2, lr_scale=0.1)], inputs={'adapter': A.build_inputs(episodes, arrays)})
  logs = []
  one = [r.values for r in fit.crossfit(problem, knobs, fixed, rows, split, schedule, **kw)]
  two = [r.values for r in fit.crossfit(problem, knobs, fixed, rows, split, schedule, devices=jax.devices(), log=logs.append, **kw)]
  print('RESULT ' + json.dumps({'equal': one == two, 'log': logs}))
""")


@pytest.mark.slow
def test_crossfit_runs_folds_in_turn_when_its_step_calls_lapack():
  out = script_result(GUARD_SCRIPT, timeout=300)
  assert out['equal']
  assert 'folds run one after another' in out['log'][0] and 'potrf' in out['log'][0]
