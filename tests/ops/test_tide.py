"""Tide: JAX equals the loop reference, equal k, the tie rule at the cut, N_real edge cases, gradient in the recency
weight; its registry declaration (knobs ``recency``, ``pool``, ``base``)."""

import hypothesis.strategies as st
import jax
import numpy as np
import ops_testing
import pytest
from hypothesis import given

from engram_jax.ops import tide
from engram_jax.testing import reference as ref

N_PAD, Q = 40, 3
DEPTHS = (1, 7, 60)  # 60 > N: every real item

tide_jit = jax.jit(tide.tide_scores, static_argnames=('depth',))


@st.composite
def legs(draw):
  """Base scores [Q, 40] (cosine-like, BM25-like with zeros, or with -inf holes), positions, mask."""
  seed = draw(st.integers(0, 2**32 - 1))
  n = draw(st.integers(1, N_PAD))
  kind = draw(st.sampled_from(['cos', 'bm25', 'holes']))
  rng = np.random.default_rng(seed)
  where = np.zeros(N_PAD, bool)
  where[rng.choice(N_PAD, n, replace=False)] = True
  base = rng.uniform(-1, 1, size=(Q, N_PAD))
  if kind == 'bm25':  # many exact zeros: ties everywhere, resolved by the shared rule
    base = np.where(rng.random((Q, N_PAD)) < 0.5, 0.0, rng.exponential(5.0, (Q, N_PAD)))
  elif kind == 'holes':  # a leg that ranks only some items
    base = np.where(rng.random((Q, N_PAD)) < 0.4, -np.inf, base)
  positions = np.where(where, np.cumsum(where) - 1, 0).astype(np.float64)
  return base, positions, where


@given(legs(), st.sampled_from(DEPTHS), st.floats(0.0, 2.0))
def test_tide_matches_reference(leg, depth, weight):
  base, positions, where = leg
  got = np.asarray(tide_jit(base, positions, weight=weight, depth=depth, where=where))
  for qi in range(Q):
    want = ref.tide_scores_ref(base[qi], positions, weight=weight, depth=depth, where=where)
    np.testing.assert_array_equal(np.isneginf(got[qi]), np.isneginf(want))
    np.testing.assert_allclose(got[qi], want, rtol=1e-12)
  # Equal k: Tide returns exactly the base's top-depth ranked items, never others.
  ranked = (np.isfinite(base) & where).sum(-1)
  assert (np.isfinite(got).sum(-1) == np.minimum(depth, ranked)).all()
  assert not (np.isfinite(got) & ~(np.isfinite(base) & where)).any()


def test_tie_at_the_cut_later_item_wins():
  base = np.array([0.5, 0.9, 0.5, 0.5, 0.1])
  got = np.asarray(tide_jit(base, np.arange(5.0), weight=0.0, depth=3))
  # top-3 of [0.5, 0.9, 0.5, 0.5, 0.1] under the shared rule: 1, then 3 and 2 (later wins).
  assert np.isfinite(got).tolist() == [False, True, True, True, False]
  np.testing.assert_array_equal(got, ref.tide_scores_ref(base, np.arange(5.0), weight=0.0, depth=3))


def test_recency_term_and_small_lists():
  base = np.zeros(4)
  got = np.asarray(tide_jit(base, np.arange(4.0), weight=0.3, depth=60))
  np.testing.assert_allclose(got, [0.0, 0.1, 0.2, 0.3])  # 0 (oldest) .. weight (newest)
  one = np.asarray(tide_jit(base, np.zeros(4), weight=0.3, depth=60, where=np.eye(4, dtype=bool)[2]))
  assert one[2] == 0.0 and np.isneginf(np.delete(one, 2)).all()  # N_real = 1: bonus 0, no NaN
  none = np.asarray(tide_jit(base, np.arange(4.0), weight=0.3, depth=60, where=np.zeros(4, bool)))
  assert np.isneginf(none).all()


@pytest.mark.slow  # heavy compile: the fast tier keeps this module's lighter tests and test_registry_twins
def test_jit_eager_vmap_loop():
  rng = np.random.default_rng(0)
  base = rng.normal(size=(Q, N_PAD))
  pos = np.arange(N_PAD, dtype=np.float64)
  where = rng.random(N_PAD) < 0.7
  kw = dict(weight=0.2, depth=7, where=where)
  jitted = tide_jit(base, pos, **kw)
  np.testing.assert_allclose(tide.tide_scores(base, pos, **kw), jitted, rtol=1e-12)
  vmapped = jax.vmap(lambda b: tide_jit(b, pos, **kw))(base)
  np.testing.assert_array_equal(vmapped, np.stack([tide_jit(b, pos, **kw) for b in base]))
  np.testing.assert_array_equal(vmapped, jitted)
  # Per-row masks and positions broadcast.
  per_row = tide_jit(
    base, np.broadcast_to(pos, base.shape), weight=0.2, depth=7, where=np.broadcast_to(where, base.shape)
  )
  np.testing.assert_array_equal(per_row, jitted)
  with pytest.raises(ValueError):
    tide.tide_scores(base, pos, weight=0.1, depth=0)


# ---- soft twin: the hard operator on precomputed base scores ---------------------------------------------------


def test_check_grads_tide():
  docs, qs = ops_testing.unit_episode(n=20, d=6, q=2, seed=5)
  cos = qs @ docs.T
  ops_testing.grads_ok(lambda w: tide.tide_scores(cos, np.arange(20), weight=w, depth=6), (0.2,), modes=['rev'])


@pytest.mark.parametrize('base', ['cosine', 'bm25'])
def test_leg_is_the_base_top_pool_plus_recency(base):
  """The leg's knobs (``recency``, ``pool``, ``base``) reach tide_scores: its scores are the base leg's top-``pool``
  plus ``recency * position / (N - 1)``."""
  arr = ops_testing.small_arrays()
  key = jax.random.key(0)
  got = np.asarray(tide.tide_leg(arr, key, recency=0.4, pool=5, base=base, k1=1.2))
  s = np.asarray(tide.base_scores(arr, key, base=base, k1=1.2, b=0.75, epsilon=0.25))
  want = np.asarray(tide.tide_scores(s, arr.positions, weight=0.4, depth=5, where=arr.where))
  np.testing.assert_array_equal(got, want)
  assert (np.isfinite(got[: ops_testing.N_QUESTIONS]).sum(-1) == 5).all()
  with pytest.raises(ValueError, match="unknown base 'nope'"):
    tide.tide_leg(arr, key, base='nope')


def test_memory_is_linear_in_n():
  # The base's top-depth is marked by a scatter: nothing [Q, depth, N] (at Q = 4, depth 50, N = 4,096: 800k
  # elements), only [Q, N] arrays.
  base = np.random.default_rng(0).normal(size=(4, 4096))
  jaxpr = jax.make_jaxpr(lambda b: tide.tide_scores(b, np.arange(4096), weight=0.1, depth=50))(base)
  sizes = [int(np.prod(v.aval.shape)) for eqn in jaxpr.jaxpr.eqns for v in eqn.outvars]
  assert max(sizes) <= base.size
  got = np.asarray(tide.tide_scores(base, np.arange(4096), weight=0.1, depth=50))
  for i in range(4):
    np.testing.assert_allclose(
      got[i], ref.tide_scores_ref(base[i], np.arange(4096.0), weight=0.1, depth=50), rtol=1e-12
    )


@pytest.mark.slow  # heavy compile: the fast tier keeps this module's lighter tests and test_registry_twins
def test_declaration():
  ops_testing.check_declaration('tide')
