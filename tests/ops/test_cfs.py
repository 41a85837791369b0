"""CFS: JAX equals the loop reference, the tie rule, masks, batching, jit, no recompiles; its soft twin tends to it
when cold and has correct gradients; its registry declaration."""

import hypothesis.strategies as st
import numpy as np
import ops_testing
import pytest
from hypothesis import given

from engram_jax.ops import cfs, greedy
from engram_jax.testing import reference as ref

N_PAD, D_PAD, Q = ops_testing.N_PAD, ops_testing.D_PAD, ops_testing.Q
cfs_jit, run = ops_testing.cfs_jit, ops_testing.run


@given(
  ops_testing.greedy_episodes(),
  st.sampled_from([4, 45]),
  st.sampled_from([None, 6]),
  st.floats(0.0, 2.0),
  st.floats(0.1, 1.0),
)
def test_cfs_matches_reference(ep, k, pool, beta, sigma):
  docs, queries, where = ep
  sel = cfs_jit(queries, docs, k=k, beta=beta, sigma=sigma, where=where, pool=pool)
  refs = [ref.cfs_select_ref(q, docs, k=k, beta=beta, sigma=sigma, where=where, pool=pool) for q in queries]
  ops_testing.check_selection(sel, refs)


@pytest.mark.parametrize('pool', [None, 6])
def test_cfs_tie_later_item_wins(pool):
  # Below-floor items tie on log-relevance; with equal fields the later one wins.
  q = np.array([1.0, 0, 0])
  docs = np.array([[1, 0, 0], [0, -1, 0], [0, 0, -1]], np.float64)
  idx, _ = run(cfs_jit, q, docs, k=4, pool=pool)
  assert idx[0].tolist() == [0, 2, 1, -1]
  assert ref.cfs_select_ref(q, docs, k=4, pool=pool)[0].tolist() == [0, 2, 1, -1]
  # A tie-rich hand-made list (three items below the floor): JAX equals the reference.
  docs, query = ops_testing.tie_docs()
  docs = np.concatenate([docs, [[0, -1, 0]]])
  idx, scores = run(cfs_jit, query, docs, k=4, beta=0.2, sigma=0.4, pool=pool)
  r_idx, r_scores = ref.cfs_select_ref(query, docs, k=4, beta=0.2, sigma=0.4, pool=pool)
  np.testing.assert_array_equal(idx[0], r_idx)
  np.testing.assert_allclose(scores[0], r_scores, rtol=1e-12)


@pytest.mark.parametrize('pool', [None, 6])
def test_all_masked_and_short_lists(pool):
  ops_testing.check_all_masked_and_short_lists(cfs_jit, pool)


@pytest.mark.slow  # heavy compile: the fast tier keeps this module's lighter tests and test_registry_twins
def test_jit_eager_vmap_loop_batch():
  ops_testing.check_jit_eager_vmap_loop_batch(cfs.cfs_select, cfs_jit)


def test_traced_hyperparameters_do_not_recompile():
  rng = np.random.default_rng(2)
  docs = ref.pad(ref.unit_vectors(rng, N_PAD, 5), N_PAD, D_PAD)
  qs = ref.pad(ref.unit_vectors(rng, Q, 5), Q, D_PAD)
  where = np.ones(N_PAD, bool)
  cfs_jit(qs, docs, where=where, k=4, pool=6, beta=0.2, sigma=0.4)
  before = cfs_jit._cache_size()
  cfs_jit(qs, docs, where=where, k=4, pool=6, beta=0.5, sigma=0.3)
  assert cfs_jit._cache_size() == before


# ---- soft twin --------------------------------------------------------------------------------------------------


@pytest.mark.slow  # heavy compile: the fast tier keeps this module's lighter tests and test_registry_twins
def test_soft_cfs_tends_to_hard():
  ops_testing.check_soft_greedy_tends_to_hard(cfs.cfs_select, cfs.soft_cfs_select, dict(beta=0.5, sigma=0.5))


@pytest.mark.slow  # heavy compile: the fast tier keeps this module's lighter tests and test_registry_twins
def test_check_grads_soft_cfs():
  docs, qs = ops_testing.unit_episode(n=14, d=6, q=2, seed=4)
  f = lambda beta, sigma: cfs.soft_cfs_select(qs, docs, k=4, beta=beta, sigma=sigma, temperature=0.3).probs
  ops_testing.grads_ok(f, (0.5, 0.4), order=1, modes=['fwd', 'rev'])


@pytest.mark.slow
def test_declaration():
  ops_testing.check_declaration('cfs')


def test_selection_scores_scatter_the_picks():
  # K = 4 picks score 4, 3, 2, 1; -1 (no pick) is dropped; an item picked twice keeps its first score.
  idx = np.array([[3, 0, -1, -1], [2, 2, 1, -1]])
  got = np.asarray(greedy.selection_scores(greedy.Selection(idx, np.zeros(idx.shape)), n=5))
  inf = np.inf
  np.testing.assert_array_equal(got, [[3, -inf, -inf, 4, -inf], [-inf, 2, 4, -inf, -inf]])
  np.testing.assert_array_equal(got[0], ref.selection_scores_ref(idx[0], 5))
  batched = greedy.selection_scores(greedy.Selection(idx[:, None], np.zeros((2, 1, 4))), n=5)
  np.testing.assert_array_equal(np.asarray(batched)[:, 0], got)
