"""Time-aware CFS-R: each variant reduces to CFS-R at its zero knob, matches a plain NumPy reading of its
definition, prefers the newer of two identical memories, and is jit/vmap/grad-safe; the soft gate tends to the hard
one as the temperature goes to 0; the soft twins on gathered pools equal the hard operators; the three registry
declarations."""

import functools

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import ops_testing
import pytest
import scipy.optimize
import strategies
from hypothesis import given, settings
from jax.test_util import check_grads

from engram_jax.core import batch, ranking
from engram_jax.core.types import Episode, Item, Question
from engram_jax.eval import pipeline
from engram_jax.ops import cfsr, tcfsr
from engram_jax.testing import reference as ref

N_PAD, D_PAD, Q = 24, 8, 3
STATIC = ('pool', 'iterations', 'power_iterations', 'batch_size')
prior_jit = jax.jit(tcfsr.tcfsr_prior_scores, static_argnames=STATIC)
basis_jit = jax.jit(tcfsr.tcfsr_basis_scores, static_argnames=STATIC)
gated_jit = jax.jit(tcfsr.tcfsr_gated_scores, static_argnames=STATIC)
soft_jit = jax.jit(tcfsr.soft_tcfsr_gated_scores, static_argnames=STATIC)
cfsr_jit = jax.jit(cfsr.cfsr_scores, static_argnames=STATIC)

episodes = functools.partial(strategies.padded_episodes, n_pad=N_PAD, d_pad=D_PAD, q=Q)
POS = np.arange(N_PAD)


def _t(where):
  """Write-order fraction of real items, by the definition (padded rows: 0)."""
  n_real = int(where.sum())
  return np.where(where, POS / max(n_real - 1, 1), 0.0)


@pytest.mark.slow  # heavy compile: the fast tier keeps this module's lighter tests and test_registry_twins
@settings(max_examples=15)
@given(episodes(), st.sampled_from((5, 150)))
def test_zero_knob_is_cfsr(ep, pool):
  docs, queries, where = ep
  base = np.asarray(cfsr_jit(queries, docs, where=where, pool=pool, lam=0.005, w=0.9))
  for fn, kw in (
    (prior_jit, {'gamma': 0.0}),
    (basis_jit, {'alpha': 0.0}),
    (gated_jit, {'gamma': 0.0}),
    (soft_jit, {'gamma': 0.0}),
  ):
    got = np.asarray(fn(queries, docs, POS, where=where, pool=pool, lam=0.005, w=0.9, **kw))
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(base))
    np.testing.assert_allclose(got, base, rtol=1e-9, atol=1e-12)


@given(episodes(), st.floats(0.0, 1.0))
def test_prior_adds_gamma_t_on_the_pool(ep, gamma):
  docs, queries, where = ep
  base = np.asarray(cfsr_jit(queries, docs, where=where, pool=5, lam=0.005, w=0.9))
  got = np.asarray(prior_jit(queries, docs, POS, where=where, pool=5, lam=0.005, w=0.9, gamma=gamma))
  np.testing.assert_array_equal(np.isneginf(got), np.isneginf(base))
  fin = np.isfinite(base)
  np.testing.assert_allclose(got[fin], (base + gamma * _t(where))[fin], rtol=1e-9, atol=1e-12)


@pytest.mark.slow  # heavy compile: the fast tier keeps this module's lighter tests and test_registry_twins
def test_basis_is_the_nnls_over_time_augmented_vectors():
  """Converged solver: the basis variant's coefficients are scipy's NNLS over rows [c_i, alpha t_i] for the
  target [z, alpha * anchor] (with the ridge rows), so its scores equal the blend of those coefficients."""
  rng = np.random.default_rng(0)
  n, d, alpha, anchor, lam, w = 9, 5, 0.7, 1.0, 0.01, 0.8
  docs = ref.unit_vectors(rng, n, d)
  q = ref.unit_vectors(rng, 1, d)[0]
  t = np.arange(n) / (n - 1)
  got = np.asarray(
    tcfsr.tcfsr_basis_scores(q, docs, np.arange(n), pool=n, iterations=20000, lam=lam, w=w, alpha=alpha, anchor=anchor)
  )
  aug = np.hstack([docs, alpha * t[:, None]])
  target = np.concatenate([q, [alpha * anchor]])
  a, _ = scipy.optimize.nnls(np.vstack([aug.T, np.sqrt(lam) * np.eye(n)]), np.concatenate([target, np.zeros(n)]))
  mm = lambda x: (x - x.min()) / (x.max() - x.min())
  np.testing.assert_allclose(got, w * mm(a) + (1 - w) * mm(docs @ q), atol=1e-5)


def test_newer_of_two_identical_memories_wins():
  """Two copies of the same fact written at different times share CFS-R's coefficient; with time in the basis
  (or a recency prior) the newer copy takes it."""
  rng = np.random.default_rng(1)
  other = ref.unit_vectors(rng, 6, 6)
  fact = ref.unit_vectors(rng, 1, 6)[0]
  docs = np.vstack([fact, other, fact])  # positions 0 and 7 hold the same fact
  q = fact + 0.3 * other[2]
  q /= np.linalg.norm(q)
  pos = np.arange(8)
  plain = np.asarray(cfsr_jit(q, docs, pool=8))
  assert plain[7] == pytest.approx(plain[0], abs=1e-9)
  basis = np.asarray(basis_jit(q, docs, pos, pool=8, alpha=0.3))
  prior = np.asarray(prior_jit(q, docs, pos, pool=8, gamma=0.1))
  assert basis[7] > basis[0] + 0.1 and prior[7] > prior[0]
  # The revision detector sees the restated fact (identical, 7/7 of the history apart) and opens the gate.
  gated = np.asarray(gated_jit(q, docs, pos, pool=8, gamma=0.2, theta=0.9, rho0=0.5))
  np.testing.assert_allclose(gated, plain + 0.2 * pos / 7, atol=1e-9)
  closed = np.asarray(gated_jit(q, docs, pos, pool=8, gamma=0.2, theta=0.9, rho0=1.01))
  np.testing.assert_allclose(closed, plain, atol=1e-12)


@given(episodes(), st.floats(0.0, 0.9), st.floats(0.02, 0.5), st.floats(0.0, 0.5))
def test_gated_matches_reference(ep, theta, delta, rho0):
  docs, queries, where = ep
  kw = dict(pool=5, lam=0.005, w=0.9)
  base = np.asarray(cfsr_jit(queries, docs, where=where, **kw))
  got = np.asarray(gated_jit(queries, docs, POS, where=where, gamma=0.3, theta=theta, delta=delta, rho0=rho0, **kw))
  clean = np.where(where[:, None], np.nan_to_num(docs), 0.0)
  for qi in range(Q):
    r, _ = ref.revision_signal_ref(queries[qi], clean, where, pool=5, theta=theta, delta=delta)
    if abs(r - rho0) < 1e-9:
      continue  # a tie at the gate threshold: float rounding may fall either way
    want = base[qi] + 0.3 * float(r >= rho0) * _t(where)
    np.testing.assert_array_equal(np.isneginf(got[qi]), np.isneginf(want))
    fin = np.isfinite(want)
    np.testing.assert_allclose(got[qi][fin], want[fin], rtol=1e-9, atol=1e-12)


def test_soft_gate_tends_to_hard():
  rng = np.random.default_rng(2)
  docs = ref.unit_vectors(rng, 20, 4)
  qs = ref.unit_vectors(rng, 6, 4)
  kw = dict(pool=10, gamma=0.3, theta=0.5, delta=0.3, rho0=0.05)
  hard = np.asarray(gated_jit(qs, docs, np.arange(20), **kw))
  fin = np.isfinite(hard)
  errs = [
    np.abs(np.asarray(soft_jit(qs, docs, np.arange(20), temperature=tt, **kw))[fin] - hard[fin]).max()
    for tt in (1e-1, 1e-2, 1e-4)
  ]
  assert errs[-1] < 1e-6 and errs[0] >= errs[-1]


@pytest.mark.slow
def test_jit_eager_vmap_chunks_and_masked():
  rng = np.random.default_rng(3)
  docs = ref.pad(ref.unit_vectors(rng, N_PAD, 6), N_PAD, D_PAD)
  qs = ref.pad(ref.unit_vectors(rng, Q, 6), Q, D_PAD)
  where = rng.random(N_PAD) < 0.8
  np.testing.assert_allclose(
    tcfsr.tcfsr_prior_scores(qs, docs, POS, where=where, pool=6, gamma=0.2),
    prior_jit(qs, docs, POS, where=where, pool=6, gamma=0.2),
    rtol=1e-12,
  )  # eager == jit
  for jit_fn, kw in (
    (prior_jit, {'gamma': 0.2}),
    (basis_jit, {'alpha': 0.3}),
    (gated_jit, {'gamma': 0.2, 'theta': 0.3}),
    (soft_jit, {'gamma': 0.2, 'theta': 0.3}),
  ):
    jitted = np.asarray(jit_fn(qs, docs, POS, where=where, pool=6, **kw))
    np.testing.assert_allclose(jit_fn(qs, docs, POS, where=where, pool=6, batch_size=2, **kw), jitted, rtol=1e-12)
    loop = np.stack([jit_fn(q, docs, POS, where=where, pool=6, **kw) for q in qs])
    np.testing.assert_allclose(loop, jitted, rtol=1e-12)
    assert (np.isfinite(jitted).sum(-1) == 6).all()
    none = np.asarray(jit_fn(qs, docs, POS, where=np.zeros(N_PAD, bool), pool=6, **kw))
    assert np.isneginf(none).all()


@pytest.mark.slow  # heavy compile: the fast tier keeps this module's lighter tests and test_registry_twins
def test_gradients_finite_and_check_grads():
  rng = np.random.default_rng(4)
  docs = ref.pad(ref.unit_vectors(rng, N_PAD, 6), N_PAD, D_PAD)
  docs[N_PAD - 3 :] = 1e6  # padded junk (finite: the operators refuse NaN inputs) must not leak into gradients
  where = np.arange(N_PAD) < N_PAD - 3
  qs = ref.pad(ref.unit_vectors(rng, Q, 6), Q, D_PAD)
  weights = jnp.arange(N_PAD, dtype=jnp.float64)

  def total(s):
    return jnp.sum(jnp.where(jnp.isfinite(s), s * weights, 0.0))

  def prior(lam, w, gamma):
    return total(tcfsr.tcfsr_prior_scores(qs, docs, POS, where=where, pool=8, iterations=20, lam=lam, w=w, gamma=gamma))

  def basis(lam, w, alpha, anchor):
    return total(
      tcfsr.tcfsr_basis_scores(
        qs, docs, POS, where=where, pool=8, iterations=20, lam=lam, w=w, alpha=alpha, anchor=anchor
      )
    )

  def soft(gamma, theta, delta, rho0):
    return total(
      tcfsr.soft_tcfsr_gated_scores(
        qs,
        docs,
        POS,
        where=where,
        pool=8,
        iterations=20,
        gamma=gamma,
        theta=theta,
        delta=delta,
        rho0=rho0,
        temperature=0.1,
      )
    )

  for fn, args in ((prior, (0.005, 0.9, 0.2)), (basis, (0.005, 0.9, 0.3, 1.0)), (soft, (0.3, 0.2, 0.3, 0.1))):
    grads = jax.jit(jax.grad(fn, argnums=tuple(range(len(args)))))(*args)
    assert all(np.isfinite(g) for g in grads), (fn.__name__, grads)
    assert all(g != 0.0 for g in grads), (fn.__name__, grads)
  check_grads(
    jax.jit(lambda g, th, r: soft(g, th, 0.3, r)), (0.3, 0.2, 0.1), order=1, modes=['rev'], atol=1e-4, rtol=1e-4
  )
  check_grads(jax.jit(lambda a, an: basis(0.005, 0.9, a, an)), (0.3, 1.0), order=1, modes=['rev'], atol=1e-4, rtol=1e-4)


def test_knob_change_does_not_recompile():
  rng = np.random.default_rng(5)
  docs = ref.unit_vectors(rng, N_PAD, D_PAD)
  qs = ref.unit_vectors(rng, Q, D_PAD)
  basis_jit(qs, docs, POS, pool=5, alpha=0.1)
  before = basis_jit._cache_size()
  basis_jit(qs, docs, POS, pool=5, alpha=0.4)
  assert basis_jit._cache_size() == before


def _episode():
  items = tuple(
    Item(
      id=f'i{k}',
      text=f'memory number {k} about cats' if k % 3 else f'note {k} on budgets',
      parent=f's{k // 4}',
      position=k,
    )
    for k in range(12)
  )
  qs = (
    Question(id='q0', text='cats', gold=('i1',), gold_parents=('s0',), category=1),
    Question(id='q1', text='budgets', gold=('i9',), gold_parents=('s2',), category=2),
  )
  return Episode(id='e', items=items, questions=qs)


@pytest.mark.parametrize(
  'op',
  ['tcfsr_prior']
  + [
    pytest.param(o, marks=pytest.mark.slow)  # fast tier: one of three
    for o in ('tcfsr_basis', 'tcfsr_gated')
  ],
)
def test_legs_in_a_pipeline(op):
  ep = _episode()
  rng = np.random.default_rng(6)
  arr = batch.episode_arrays(
    ep, ref.unit_vectors(rng, 12, 8).astype(np.float32), ref.unit_vectors(rng, 2, 8).astype(np.float32)
  )
  leg = {
    'tcfsr_prior': tcfsr.tcfsr_prior_leg,
    'tcfsr_basis': tcfsr.tcfsr_basis_leg,
    'tcfsr_gated': tcfsr.tcfsr_gated_leg,
  }[op]
  scores = leg(arr, jax.random.key(0), pool=6)
  assert scores.shape == arr.labels.shape
  assert (np.isfinite(np.asarray(scores)).sum(-1)[:2] == 6).all()
  p = pipeline.make_pipeline(
    legs={'t': {'op': op, 'pool': 6, 'depth': 5}, 'cos': {'op': 'cosine', 'depth': 10}}, fusion='rrf', name='t'
  )
  top = np.asarray(jax.jit(functools.partial(pipeline.pipeline_topk, p, k=4))(arr, jax.random.key(0)))
  pipeline.check_equal_k(top, 2, k=4, name='t', episode='e')
  gate = np.asarray(tcfsr.revision_gate(arr, pool=6))
  assert gate.shape == (arr.queries.shape[0],) and set(np.unique(gate)) <= {0.0, 1.0}


def test_bad_shapes_raise():
  with pytest.raises(ValueError, match='Shape mismatch'):
    tcfsr.tcfsr_prior_scores(np.ones(3), np.ones((2, 4, 3)), np.arange(4))
  with pytest.raises(ValueError, match='Shape mismatch'):
    tcfsr.tcfsr_basis_scores(np.ones(3), np.ones((4, 3)), np.arange(5))


# ---- soft twins: the same operators on pools gathered once ----------------------------------------------------


@pytest.mark.parametrize('variant', ['basis'] + [pytest.param(v, marks=pytest.mark.slow) for v in ('prior', 'gated')])
def test_pool_scores_equal_the_hard_operators(variant):
  """:func:`tcfsr.pool_scores` on the cosine top-P (gathered as the fitter gathers it) equals the hard operator
  after its pool step; at a cold temperature the relaxed gate equals the hard one."""
  docs, qs = ops_testing.unit_episode(n=24, d=6, q=4, seed=7)
  docs[20] = docs[3]  # a restated fact, so that the revision gate opens for some query
  qs[0] = (docs[3] + 0.2 * docs[9]) / np.linalg.norm(docs[3] + 0.2 * docs[9])
  where = np.arange(24) < 22
  knobs = {
    'prior': dict(gamma=0.3),
    'basis': dict(alpha=0.4, anchor=0.8),
    'gated': dict(gamma=0.3, theta=0.6, delta=0.2, rho0=0.1),
  }[variant]
  hard_fn = {'prior': tcfsr.tcfsr_prior_scores, 'basis': tcfsr.tcfsr_basis_scores, 'gated': tcfsr.tcfsr_gated_scores}[
    variant
  ]
  hard = np.asarray(hard_fn(qs, docs, np.arange(24), where=where, pool=10, iterations=30, lam=0.02, w=0.7, **knobs))
  cos = np.where(where, qs @ docs.T, -np.inf)
  idx = np.asarray(ranking.top_k(cos, k=10, where=np.broadcast_to(where, cos.shape))[0])
  t = np.asarray(tcfsr.write_time(np.arange(24), where))
  args = (np.take_along_axis(cos, idx, -1), (docs @ docs.T)[idx[:, :, None], idx[:, None, :]], t[idx], where[idx])
  want = np.take_along_axis(hard, idx, -1)
  for temperature in [None, 1e-9] if variant == 'gated' else [None]:
    got = np.asarray(
      tcfsr.pool_scores(*args, variant=variant, lam=0.02, w=0.7, iterations=30, temperature=temperature, **knobs)
    )
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
  if variant == 'gated':  # the case above exercises an open gate
    sol_open = np.asarray(
      hard_fn(qs, docs, np.arange(24), where=where, pool=10, iterations=30, lam=0.02, w=0.7, **{**knobs, 'gamma': 0.0})
    )
    assert not np.allclose(hard, sol_open)


@pytest.mark.slow
@pytest.mark.parametrize('op', ['tcfsr_prior', 'tcfsr_basis', 'tcfsr_gated'])
def test_declaration(op):
  ops_testing.check_declaration(op)
