"""Time-aware CFS-R with a learned question-aware gate: reduces to CFS-R at gamma 0 and to the recency prior at
gamma / 2 with zero gate weights, matches a plain NumPy reading of its definition, its soft twin on gathered pools
equals it, the gate reads the question's text features, and its registry declaration."""

import functools

import hypothesis.strategies as st
import jax
import numpy as np
import ops_testing
import pytest
import strategies
from hypothesis import given, settings

from engram_jax.core import features, ranking
from engram_jax.ops import cfsr, tcfsr
from engram_jax.ops import tcfsr_learned as tl
from engram_jax.testing import reference as ref

N_PAD, D_PAD, Q = 24, 8, 3
STATIC = ('pool', 'iterations', 'power_iterations', 'batch_size', 'theta', 'delta')
learned_jit = jax.jit(tl.tcfsr_learned_scores, static_argnames=STATIC)
prior_jit = jax.jit(tcfsr.tcfsr_prior_scores, static_argnames=('pool', 'iterations', 'power_iterations', 'batch_size'))
cfsr_jit = jax.jit(cfsr.cfsr_scores, static_argnames=('pool', 'iterations', 'power_iterations', 'batch_size'))
episodes = functools.partial(strategies.padded_episodes, n_pad=N_PAD, d_pad=D_PAD, q=Q)
POS = np.arange(N_PAD)
TEXTS = ['Where does she live now?', 'When did he first visit Paris?', 'How many books did I buy in total?']
F = features.question_features(TEXTS)


def _t(where):
  n_real = int(where.sum())
  return np.where(where, POS / max(n_real - 1, 1), 0.0)


def test_question_features():
  np.testing.assert_array_equal(F, [[1, 0, 0, 1], [0, 1, 0, 1], [0, 0, 1, 1]])
  assert features.FEATURES == ('current', 'when', 'count', 'bias')
  assert features.question_features(['The newest renewal?'])[0].tolist() == [0, 0, 0, 1]  # whole words only


@settings(max_examples=15)
@given(episodes())
def test_zero_gamma_is_cfsr_and_zero_weights_are_the_half_prior(ep):
  docs, queries, where = ep
  kw = dict(where=where, pool=5, lam=0.005, w=0.9)
  base = np.asarray(cfsr_jit(queries, docs, **kw))
  u = np.array([1.5, -2.0, 0.5, 0.3, 4.0, -1.0], np.float32)
  got = np.asarray(learned_jit(queries, docs, POS, F, weights=u, gamma=0.0, **kw))
  np.testing.assert_array_equal(np.isneginf(got), np.isneginf(base))
  np.testing.assert_allclose(got, base, rtol=1e-9, atol=1e-12)
  half = np.asarray(learned_jit(queries, docs, POS, F, weights=np.zeros(6, np.float32), gamma=0.4, **kw))
  prior = np.asarray(prior_jit(queries, docs, POS, gamma=0.2, **kw))
  np.testing.assert_allclose(half, prior, rtol=1e-6, atol=1e-6)


@given(episodes(), st.lists(st.floats(-3.0, 3.0), min_size=6, max_size=6), st.floats(0.0, 1.0), st.floats(0.0, 0.9))
def test_matches_reference(ep, u, gamma, theta):
  docs, queries, where = ep
  u = np.asarray(u, np.float32)
  kw = dict(where=where, pool=5, lam=0.005, w=0.9)
  base = np.asarray(cfsr_jit(queries, docs, **kw))
  got = np.asarray(learned_jit(queries, docs, POS, F, weights=u, gamma=gamma, theta=theta, delta=0.1, **kw))
  clean = np.where(where[:, None], np.nan_to_num(docs), 0.0)
  for qi in range(Q):
    r, top = ref.revision_signal_ref(queries[qi], clean, where, pool=5, theta=theta, delta=0.1)
    x = np.concatenate([F[qi], [r, top]])
    g = 1.0 / (1.0 + np.exp(-(u @ x)))
    want = base[qi] + gamma * g * _t(where)
    np.testing.assert_array_equal(np.isneginf(got[qi]), np.isneginf(want))
    fin = np.isfinite(want)
    np.testing.assert_allclose(got[qi][fin], want[fin], rtol=1e-5, atol=1e-5)


def test_gate_reads_the_question():
  """Same pool, other question features: the gate and so the recency bonus differ."""
  docs, qs = ops_testing.unit_episode(n=20, d=6, q=1, seed=3)
  qs = np.repeat(qs, 2, axis=0)
  f = features.question_features(['What is her job now?', 'What was her job?'])
  u = np.array([4.0, 0.0, 0.0, -2.0, 0.0, 0.0], np.float32)  # open on "current" cues only
  s = np.asarray(learned_jit(qs, docs, np.arange(20), f, weights=u, pool=20, gamma=0.5))
  base = np.asarray(cfsr_jit(qs, docs, pool=20))
  t = np.arange(20) / 19
  np.testing.assert_allclose(s[0] - base[0], 0.5 / (1 + np.exp(-2.0)) * t, atol=1e-5)
  np.testing.assert_allclose(s[1] - base[1], 0.5 / (1 + np.exp(2.0)) * t, atol=1e-5)


@pytest.mark.slow  # heavy compile: the fast tier keeps this module's lighter tests and test_registry_twins
def test_pool_scores_equal_the_hard_operator():
  docs, qs = ops_testing.unit_episode(n=24, d=6, q=3, seed=7)
  docs[20] = docs[3]  # a restated fact: the revision signal is non-zero for some query
  qs[0] = (docs[3] + 0.2 * docs[9]) / np.linalg.norm(docs[3] + 0.2 * docs[9])
  where = np.arange(24) < 22
  u = np.array([1.0, -0.5, 0.2, 0.1, 3.0, 0.5], np.float32)
  kw = dict(lam=0.02, w=0.7, gamma=0.3, theta=0.6, delta=0.2)
  hard = np.asarray(
    tl.tcfsr_learned_scores(qs, docs, np.arange(24), F, weights=u, where=where, pool=10, iterations=30, **kw)
  )
  cos = np.where(where, qs @ docs.T, -np.inf)
  idx = np.asarray(ranking.top_k(cos, k=10, where=np.broadcast_to(where, cos.shape))[0])
  t = np.asarray(tcfsr.write_time(np.arange(24), where))
  got = np.asarray(
    tl.learned_pool_scores(
      np.take_along_axis(cos, idx, -1),
      (docs @ docs.T)[idx[:, :, None], idx[:, None, :]],
      t[idx],
      where[idx],
      F,
      weights=u,
      iterations=30,
      **kw,
    )
  )
  np.testing.assert_allclose(got, np.take_along_axis(hard, idx, -1), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_declaration():
  ops_testing.check_declaration('tcfsr_learned')
