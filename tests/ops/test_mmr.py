"""MMR: JAX equals the loop reference, the tie rule, masks, batching, jit; its soft twin tends to it when cold and has
correct gradients; its registry declaration."""

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import ops_testing
import pytest
from hypothesis import given

from engram_jax.ops import mmr
from engram_jax.testing import reference as ref

mmr_jit, cfs_jit, run = ops_testing.mmr_jit, ops_testing.cfs_jit, ops_testing.run


@given(ops_testing.greedy_episodes(), st.sampled_from([4, 45]), st.sampled_from([None, 6]), st.floats(0.0, 1.0))
def test_mmr_matches_reference(ep, k, pool, lam):
  docs, queries, where = ep
  sel = mmr_jit(queries, docs, k=k, lam=lam, where=where, pool=pool)
  refs = [ref.mmr_select_ref(q, docs, k=k, lam=lam, where=where, pool=pool) for q in queries]
  ops_testing.check_selection(sel, refs)


@pytest.mark.parametrize('pool', [None, 6])
def test_mmr_tie_later_item_wins(pool):
  docs, query = ops_testing.tie_docs()
  # lam = 0: s first (max relevance); then w (penalty -1); then x and y both have penalty exactly
  # 0 -> tie -> the later item y (2), although x comes first in the pool's cosine order.
  idx, _ = run(mmr_jit, query, docs, k=4, lam=0.0, pool=pool)
  assert idx[0].tolist() == [1, 3, 2, 0]
  assert ref.mmr_select_ref(query, docs, k=4, lam=0.0, pool=pool)[0].tolist() == [1, 3, 2, 0]
  # Duplicates of the most relevant item: the later copy is picked first (CFS too).
  dup = np.array([[1, 0, 0], [0, 1, 0], [1, 0, 0]], np.float64)
  for fn in (cfs_jit, mmr_jit):
    assert run(fn, np.array([1.0, 0, 0]), dup, k=4, pool=pool)[0][0, 0] == 2


@pytest.mark.parametrize('pool', [None, 6])
def test_all_masked_and_short_lists(pool):
  ops_testing.check_all_masked_and_short_lists(mmr_jit, pool)


@pytest.mark.slow  # heavy compile: the fast tier keeps this module's lighter tests and test_registry_twins
def test_jit_eager_vmap_loop_batch():
  ops_testing.check_jit_eager_vmap_loop_batch(mmr.mmr_select, mmr_jit)


# ---- soft twin --------------------------------------------------------------------------------------------------


@pytest.mark.slow  # heavy compile: the fast tier keeps this module's lighter tests and test_registry_twins
def test_soft_mmr_tends_to_hard():
  ops_testing.check_soft_greedy_tends_to_hard(mmr.mmr_select, mmr.soft_mmr_select, dict(lam=0.6))


@pytest.mark.slow  # heavy compile: the fast tier keeps this module's lighter tests and test_registry_twins
def test_check_grads_soft_mmr():
  docs, qs = ops_testing.unit_episode(n=14, d=6, q=2, seed=4)
  f = lambda lam, t: mmr.soft_mmr_select(qs, docs, k=4, lam=lam, temperature=t).probs
  ops_testing.grads_ok(f, (0.6, 0.05), order=1, modes=['fwd', 'rev'])


@pytest.mark.slow
def test_declaration():
  ops_testing.check_declaration('mmr')


@pytest.mark.slow  # heavy compile: the fast tier keeps this module's lighter tests and test_registry_twins
def test_soft_mmr_gradient_is_finite_with_padded_pool_slots():
  rel = np.array([0.9, 0.5, 0.2, -np.inf])  # the soft twin's pool cosines: the last slot is padding
  valid = np.array([True, True, True, False])
  f = lambda lam: jnp.sum(
    mmr.soft_mmr_select_gram(rel, np.eye(4), k=2, lam=lam, temperature=0.1, where=valid).probs * jnp.arange(4)
  )
  assert np.isfinite(jax.grad(f)(0.5))
