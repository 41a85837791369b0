"""Tide: JAX equals the loop reference, equal k, the tie rule at the cut, N_real edge cases."""

import hypothesis.strategies as st
import jax
import numpy as np
import pytest
from hypothesis import given

import reference_ops as ref
from engram_jax import recency

N_PAD, Q = 40, 3
DEPTHS = (1, 7, 60)  # 60 > N: every real item

tide_jit = jax.jit(recency.tide_scores, static_argnames=('depth',))


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


def test_jit_eager_vmap_loop():
  rng = np.random.default_rng(0)
  base = rng.normal(size=(Q, N_PAD))
  pos = np.arange(N_PAD, dtype=np.float64)
  where = rng.random(N_PAD) < 0.7
  kw = dict(weight=0.2, depth=7, where=where)
  jitted = tide_jit(base, pos, **kw)
  np.testing.assert_allclose(recency.tide_scores(base, pos, **kw), jitted, rtol=1e-12)
  vmapped = jax.vmap(lambda b: tide_jit(b, pos, **kw))(base)
  np.testing.assert_array_equal(vmapped, np.stack([tide_jit(b, pos, **kw) for b in base]))
  np.testing.assert_array_equal(vmapped, jitted)
  # Per-row masks and positions broadcast.
  per_row = tide_jit(base, np.broadcast_to(pos, base.shape), weight=0.2, depth=7,
                     where=np.broadcast_to(where, base.shape))
  np.testing.assert_array_equal(per_row, jitted)
  with pytest.raises(ValueError):
    recency.tide_scores(base, pos, weight=0.1, depth=0)
