"""MMR and CFS: JAX equals the loop reference, the tie rule, masks, batching, jit."""


import functools

import hypothesis.strategies as st
import jax
import numpy as np
import pytest
from hypothesis import given

import reference_ops as ref
import strategies
from engram_jax import diversity

N_PAD, D_PAD, Q = 40, 16, 3  # fixed padded shapes: one compilation per static (k, pool)

mmr_jit = jax.jit(diversity.mmr_select, static_argnames=('k', 'pool'))
cfs_jit = jax.jit(diversity.cfs_select, static_argnames=('k', 'pool', 'floor'))


def _hyper(fn, **kw):
  """Passes the traced hyperparameters explicitly, as the hypothesis tests do, so that jit's cache
  (keyed on which keywords are given) is shared."""
  defaults = dict(lam=0.5) if fn is mmr_jit else dict(beta=0.2, sigma=0.4)
  return {**defaults, **kw}


episodes = functools.partial(strategies.padded_episodes, n_pad=N_PAD, d_pad=D_PAD, q=Q)


def _check_selection(sel, refs):
  idx = np.asarray(sel.indices)
  scores = np.asarray(sel.scores)
  assert idx.dtype == np.int32
  for qi, (r_idx, r_scores) in enumerate(refs):
    np.testing.assert_array_equal(idx[qi], r_idx)
    np.testing.assert_allclose(scores[qi], r_scores, rtol=1e-9, atol=1e-12)
  assert not np.isnan(scores).any()


@given(episodes(), st.sampled_from([4, 45]), st.sampled_from([None, 6]), st.floats(0.0, 1.0))
def test_mmr_matches_reference(ep, k, pool, lam):
  docs, queries, where = ep
  sel = mmr_jit(queries, docs, k=k, lam=lam, where=where, pool=pool)
  refs = [ref.mmr_select_ref(q, docs, k=k, lam=lam, where=where, pool=pool) for q in queries]
  _check_selection(sel, refs)


@given(episodes(), st.sampled_from([4, 45]), st.sampled_from([None, 6]), st.floats(0.0, 2.0),
       st.floats(0.1, 1.0))
def test_cfs_matches_reference(ep, k, pool, beta, sigma):
  docs, queries, where = ep
  sel = cfs_jit(queries, docs, k=k, beta=beta, sigma=sigma, where=where, pool=pool)
  refs = [ref.cfs_select_ref(q, docs, k=k, beta=beta, sigma=sigma, where=where, pool=pool) for q in queries]
  _check_selection(sel, refs)


@given(episodes())
def test_gram_and_selection_scores(ep):
  docs, queries, where = ep
  clean = np.where(where[:, None], docs, 0.0)  # a gram with NaN rows would still be fine, but keep it simple
  gram = clean @ clean.T
  for fn in (mmr_jit, cfs_jit):
    a = fn(queries, clean, **_hyper(fn, k=45, where=where, pool=6))
    b = fn(queries, clean, **_hyper(fn, k=45, where=where, pool=6, gram=gram))
    np.testing.assert_array_equal(a.indices, b.indices)
    np.testing.assert_allclose(a.scores, b.scores, rtol=1e-9, atol=1e-12)
    leg = np.asarray(diversity.selection_scores(a, n=N_PAD))
    for qi in range(Q):
      np.testing.assert_array_equal(leg[qi], ref.selection_scores_ref(np.asarray(a.indices[qi]), N_PAD))


def run(fn, queries, docs, where=None, **kw):
  """Calls a jitted op at the hypothesis shapes (so compilations are shared): pads the list to
  N_PAD rows (masked), dims to D_PAD and the queries to Q rows; returns numpy (indices, scores)."""
  queries = np.atleast_2d(queries)
  n, d = docs.shape
  wh = np.zeros(N_PAD, bool)
  wh[:n] = True if where is None else where
  qs = ref.pad(np.concatenate([queries, np.repeat(queries[:1], Q - len(queries), 0)]), Q, D_PAD)
  sel = fn(qs, ref.pad(docs, N_PAD, D_PAD), **_hyper(fn, where=wh, **kw))
  return np.asarray(sel.indices)[:len(queries)], np.asarray(sel.scores)[:len(queries)]


def _tie_docs():
  # 0: x = e2 (rel .6), 1: s = e1 (rel .8), 2: y = e3 (rel 0), 3: w = -e1 (rel -.8)
  docs = np.array([[0, 1, 0], [1, 0, 0], [0, 0, 1], [-1, 0, 0]], np.float64)
  query = np.array([0.8, 0.6, 0.0])
  return docs, query


@pytest.mark.parametrize('pool', [None, 6])
def test_mmr_tie_later_item_wins(pool):
  docs, query = _tie_docs()
  # lam = 0: s first (max relevance); then w (penalty -1); then x and y both have penalty exactly
  # 0 -> tie -> the later item y (2), although x comes first in the pool's cosine order.
  idx, _ = run(mmr_jit, query, docs, k=4, lam=0.0, pool=pool)
  assert idx[0].tolist() == [1, 3, 2, 0]
  assert ref.mmr_select_ref(query, docs, k=4, lam=0.0, pool=pool)[0].tolist() == [1, 3, 2, 0]
  # Duplicates of the most relevant item: the later copy is picked first.
  dup = np.array([[1, 0, 0], [0, 1, 0], [1, 0, 0]], np.float64)
  for fn in (cfs_jit, mmr_jit):
    assert run(fn, np.array([1.0, 0, 0]), dup, k=4, pool=pool)[0][0, 0] == 2


@pytest.mark.parametrize('pool', [None, 6])
def test_cfs_tie_later_item_wins(pool):
  # Below-floor items tie on log-relevance; with equal fields the later one wins.
  q = np.array([1.0, 0, 0])
  docs = np.array([[1, 0, 0], [0, -1, 0], [0, 0, -1]], np.float64)
  idx, _ = run(cfs_jit, q, docs, k=4, pool=pool)
  assert idx[0].tolist() == [0, 2, 1, -1]
  assert ref.cfs_select_ref(q, docs, k=4, pool=pool)[0].tolist() == [0, 2, 1, -1]
  # A tie-rich hand-made list (three items below the floor): JAX equals the reference.
  docs, query = _tie_docs()
  docs = np.concatenate([docs, [[0, -1, 0]]])
  idx, scores = run(cfs_jit, query, docs, k=4, beta=0.2, sigma=0.4, pool=pool)
  r_idx, r_scores = ref.cfs_select_ref(query, docs, k=4, beta=0.2, sigma=0.4, pool=pool)
  np.testing.assert_array_equal(idx[0], r_idx)
  np.testing.assert_allclose(scores[0], r_scores, rtol=1e-12)


@pytest.mark.parametrize('fn', [mmr_jit, cfs_jit])
@pytest.mark.parametrize('pool', [None, 6])
def test_all_masked_and_short_lists(fn, pool):
  rng = np.random.default_rng(0)
  docs = ref.unit_vectors(rng, 8, 4)
  q = ref.unit_vectors(rng, 2, 4)
  idx, scores = run(fn, q, docs, where=np.zeros(8, bool), k=45, pool=pool)
  assert (idx == -1).all() and np.isneginf(scores).all()
  assert np.isneginf(np.asarray(diversity.selection_scores(diversity.Selection(idx, scores), n=8))).all()
  where = np.zeros(8, bool)
  where[[2, 5]] = True
  idx, scores = run(fn, q, docs, where=where, k=45, pool=pool)
  assert sorted(idx[:, :2].ravel().tolist()) == [2, 2, 5, 5] and (idx[:, 2:] == -1).all()
  assert not np.isnan(scores).any() and np.isfinite(scores[:, :2]).all()


@pytest.mark.parametrize('fn,jf', [(diversity.mmr_select, mmr_jit), (diversity.cfs_select, cfs_jit)],
                         ids=['mmr', 'cfs'])
def test_jit_eager_vmap_loop_batch(fn, jf):
  rng = np.random.default_rng(1)
  docs = ref.pad(ref.unit_vectors(rng, N_PAD, 8), N_PAD, D_PAD)
  qs = ref.pad(ref.unit_vectors(rng, Q, 8), Q, D_PAD)
  where = rng.random(N_PAD) < 0.8
  kw = _hyper(jf, k=4, pool=6)  # the hypothesis tests' arguments and shapes: cached compilations
  eager = fn(qs, docs, where=where, **kw)
  jitted = jf(qs, docs, where=where, **kw)
  np.testing.assert_array_equal(eager.indices, jitted.indices)
  np.testing.assert_allclose(eager.scores, jitted.scores, rtol=1e-12)
  # vmap over single queries == a Python loop over them == the batched call.
  vmapped = jax.vmap(lambda q: jf(q, docs, where=where, **kw))(qs)
  loop = [jf(q, docs, where=where, **kw) for q in qs]
  np.testing.assert_array_equal(vmapped.indices, np.stack([s.indices for s in loop]))
  np.testing.assert_allclose(vmapped.scores, np.stack([s.scores for s in loop]), rtol=1e-12)
  np.testing.assert_array_equal(vmapped.indices, eager.indices)
  # Per-list docs [B, 1, N, D] with where [B, 1, N] broadcast against queries [B, Q, D]: equals one
  # call per list.
  docs_b = np.stack([docs, docs[::-1]])
  where_b = np.stack([where, where[::-1]])
  batched = jf(np.stack([qs, qs[::-1]]), docs_b[:, None], where=where_b[:, None], **kw)
  np.testing.assert_array_equal(batched.indices[0], jitted.indices)
  np.testing.assert_array_equal(batched.indices[1], jf(qs[::-1], docs_b[1], where=where_b[1], **kw).indices)


def test_traced_hyperparameters_do_not_recompile():
  rng = np.random.default_rng(2)
  docs = ref.pad(ref.unit_vectors(rng, N_PAD, 5), N_PAD, D_PAD)
  qs = ref.pad(ref.unit_vectors(rng, Q, 5), Q, D_PAD)
  where = np.ones(N_PAD, bool)
  cfs_jit(qs, docs, where=where, k=4, pool=6, beta=0.2, sigma=0.4)
  before = cfs_jit._cache_size()
  cfs_jit(qs, docs, where=where, k=4, pool=6, beta=0.5, sigma=0.3)
  assert cfs_jit._cache_size() == before
