"""Controls: cos2 (perturbed cosine) and mem0-style additive fusion against a dict-based reference; their registry
declarations (no soft twin: they are not fitted)."""

import hypothesis.strategies as st
import jax
import numpy as np
import ops_testing
import pytest
from hypothesis import given

from engram_jax.ops import controls
from engram_jax.ops.cosine import cosine_scores
from engram_jax.testing import reference as ref

N_PAD, D_PAD, Q = 40, 16, 3
POOLS = (1, 6, 60)

fuse_jit = jax.jit(controls.additive_fuse, static_argnames=('pool',))
cos2_jit = jax.jit(controls.perturbed_cosine)


@st.composite
def episodes(draw):
  seed = draw(st.integers(0, 2**32 - 1))
  n = draw(st.integers(1, N_PAD))
  d = draw(st.integers(2, D_PAD))
  rng = np.random.default_rng(seed)
  docs = ref.pad(ref.unit_vectors(rng, N_PAD, d), N_PAD, D_PAD)
  queries = ref.pad(ref.unit_vectors(rng, Q, d), Q, D_PAD)
  where = np.zeros(N_PAD, bool)
  where[rng.choice(N_PAD, n, replace=False)] = True
  # BM25-like: zero for most items (no shared term), else a positive raw score around the midpoints.
  bm25 = np.where(
    rng.random((Q, N_PAD)) < draw(st.sampled_from([0.0, 0.6, 1.0])), 0.0, rng.exponential(6.0, (Q, N_PAD))
  )
  n_terms = rng.integers(0, 20, size=Q)
  return docs, queries, where, bm25, n_terms


@given(episodes(), st.sampled_from(POOLS), st.floats(-0.2, 0.5))
def test_additive_fuse_matches_reference(ep, pool, threshold):
  docs, queries, where, bm25, n_terms = ep
  sem = queries @ docs.T
  got = np.asarray(fuse_jit(sem, bm25, n_terms, where=where, threshold=threshold, pool=pool))
  assert not np.isnan(got).any() and (got <= 1.0).all()
  for qi in range(Q):
    want = ref.additive_fuse_ref(sem[qi], bm25[qi], int(n_terms[qi]), where=where, threshold=threshold, pool=pool)
    np.testing.assert_array_equal(np.isneginf(got[qi]), np.isneginf(want))
    np.testing.assert_allclose(got[qi], want, rtol=1e-12)


def test_mem0_sigmoid_table():
  n = np.array([0, 1, 3, 4, 6, 7, 9, 10, 15, 16, 40])
  mid, steep = controls.mem0_bm25_params(n)
  want = [ref.mem0_bm25_params_ref(int(t)) for t in n]
  np.testing.assert_array_equal(mid, [m for m, _ in want])
  np.testing.assert_allclose(steep, [s for _, s in want])


def test_additive_fuse_hand_values():
  sem = np.array([0.9, 0.5, 0.05, 0.3])
  bm25 = np.array([0.0, 5.0, 9.0, 0.0])  # 2 query terms: midpoint 5, steepness 0.7
  got = np.asarray(controls.additive_fuse(sem, bm25, np.array(2), pool=60))
  # BM25 active -> divide by 2; item 1's bm25 sits at the midpoint -> 0.5; item 2 fails the gate.
  np.testing.assert_allclose(got, [0.45, 0.5, -np.inf, 0.15])
  got = np.asarray(controls.additive_fuse(sem, np.zeros(4), np.array(2), pool=60))
  np.testing.assert_allclose(got, [0.9, 0.5, -np.inf, 0.3])  # no BM25 signal: divide by 1
  masked = np.asarray(controls.additive_fuse(sem, bm25, np.array(2), where=np.zeros(4, bool)))
  assert np.isneginf(masked).all()
  # Only the semantic pool is scored; BM25 never adds a candidate.
  got = np.asarray(controls.additive_fuse(sem, bm25, np.array(2), pool=2))
  assert np.isfinite(got).tolist() == [True, True, False, False]


def test_perturbed_cosine():
  rng = np.random.default_rng(0)
  docs = ref.unit_vectors(rng, N_PAD, 8)
  qs = ref.unit_vectors(rng, Q, 8)
  where = rng.random(N_PAD) < 0.8
  key = jax.random.key(7)
  cos = np.asarray(cosine_scores(qs, docs, where=where))
  got = np.asarray(cos2_jit(qs, docs, key=key, eps=0.3, where=where))
  noise = np.array(
    [
      [float(jax.random.normal(jax.random.fold_in(jax.random.fold_in(key, r), i), (), got.dtype)) for i in range(N_PAD)]
      for r in range(Q)
    ]
  )  # one draw per (question, item)
  np.testing.assert_allclose(got, cos + 0.3 * noise, rtol=1e-6)  # -inf stays -inf where masked
  # the draw does not depend on the padding: the first rows and columns of a larger problem are the same
  big = np.asarray(
    controls.perturbed_cosine(
      np.pad(qs, [(0, 3), (0, 0)]), np.pad(docs, [(0, 5), (0, 0)]), key=key, eps=0.3, where=np.pad(where, (0, 5))
    )
  )
  np.testing.assert_allclose(big[:Q, :N_PAD], got, rtol=1e-12, atol=1e-12)
  np.testing.assert_array_equal(np.isneginf(got), ~np.broadcast_to(where, got.shape))
  np.testing.assert_array_equal(cos2_jit(qs, docs, key=key, eps=0.0, where=where), cos)
  np.testing.assert_allclose(controls.perturbed_cosine(qs, docs, key=key, eps=0.3, where=where), got, rtol=1e-12)
  other = np.asarray(cos2_jit(qs, docs, key=jax.random.key(8), eps=0.3, where=where))
  assert not np.allclose(other[np.isfinite(other)], got[np.isfinite(got)])
  fin = np.isfinite(got)
  resid = (got[fin] - cos[fin]) / 0.3  # the noise is standard normal
  assert abs(resid.mean()) < 0.3 and 0.7 < resid.std() < 1.3


@pytest.mark.slow  # heavy compile: the fast tier keeps this module's lighter tests and test_registry_twins
def test_jit_eager_vmap_loop():
  rng = np.random.default_rng(1)
  sem = rng.uniform(-1, 1, (Q, N_PAD))
  bm25 = rng.exponential(5.0, (Q, N_PAD))
  n_terms = np.array([2, 5, 12])
  jitted = fuse_jit(sem, bm25, n_terms, pool=6)
  np.testing.assert_allclose(controls.additive_fuse(sem, bm25, n_terms, pool=6), jitted, rtol=1e-12)
  vmapped = jax.vmap(lambda s, b, t: fuse_jit(s, b, t, pool=6))(sem, bm25, n_terms)
  loop = np.stack([fuse_jit(sem[i], bm25[i], n_terms[i], pool=6) for i in range(Q)])
  np.testing.assert_array_equal(vmapped, loop)
  np.testing.assert_array_equal(vmapped, jitted)
  with pytest.raises(Exception):
    controls.additive_fuse(sem, bm25[:, :5], n_terms)


def test_cos2_seed_selects_the_noise_draw():
  """cos2's ``seed`` knob folds into the leg's key: another seed is another draw, the same seed the same one."""
  arr = ops_testing.small_arrays()
  key = jax.random.key(3)
  a, b, c = (np.asarray(controls.cos2_leg(arr, key, eps=0.3, seed=s)) for s in (0, 1, 0))
  np.testing.assert_array_equal(a, c)
  fin = np.isfinite(a)
  assert not np.allclose(a[fin], b[fin])


@pytest.mark.slow  # heavy compile: the fast tier keeps this module's lighter tests and test_registry_twins
@pytest.mark.parametrize('op', ['cos2', 'mem0'])
def test_declaration(op):
  ops_testing.check_declaration(op)
