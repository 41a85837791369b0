"""RRF fusion: JAX equals the NumPy reference; jit / eager and all-masked lists; its soft twin tends to it when cold
and has correct gradients. (RRF is the pipeline's fusion, not a registered operator: its knobs are ``k0`` and the
legs' weights.)"""

import jax
import jax.numpy as jnp
import numpy as np
import ops_testing
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engram_jax.ops import cfs, greedy, rrf
from engram_jax.testing import reference as ref

COLD = ops_testing.COLD


@pytest.mark.slow
@given(st.integers(1, 4), st.integers(1, 25), st.data())
def test_rrf_matches_reference(n_legs, n, data):
  rng = np.random.default_rng(data.draw(st.integers(0, 2**31 - 1)))
  legs = rng.integers(0, 4, size=(n_legs, n)).astype(float)  # many ties on purpose
  legs[rng.random((n_legs, n)) < 0.2] = -np.inf  # items a leg does not rank
  weights = rng.uniform(0.1, 3.0, n_legs)
  depths = [int(x) for x in rng.integers(1, n + 2, n_legs)]
  where = rng.random(n) < 0.8
  got = rrf.rrf_fuse(legs, weights=weights, depths=depths, where=where)
  np.testing.assert_allclose(got, ref.rrf(legs, weights, depths, where=where), rtol=1e-12)


@pytest.mark.slow  # heavy compile: the fast tier keeps this module's lighter tests and test_registry_twins
def test_jit_eager_vmap_and_all_masked():
  c = ops_testing.jit_case()
  ops_testing.check_jit_eager_vmap_and_all_masked(
    lambda x, w: rrf.rrf_fuse(x, weights=jnp.array([1.0, 2.0]), depths=(3, 5), where=w),
    c['legs'],
    n=c['n'],
    qn=c['qn'],
    vmap=False,
  )


def test_rrf_rejects_depth_count_mismatch():
  with pytest.raises(ValueError, match='Shape mismatch'):
    rrf.rrf_fuse(np.zeros((2, 4)), weights=[1.0, 1.0], depths=[3])


# ---- soft twin --------------------------------------------------------------------------------------------------


@pytest.mark.slow  # heavy compile: the fast tier keeps this module's lighter tests and test_registry_twins
@pytest.mark.parametrize('candidates', [None, 8])
def test_soft_rrf_tends_to_rrf(candidates):
  rng = np.random.default_rng(2)
  legs = rng.normal(size=(3, 2, 25))
  legs[2, :, 10:] = -np.inf  # a leg that ranks only some items
  where = np.ones((2, 25), bool)
  where[:, -3:] = False
  docs, qs = ops_testing.unit_episode(n=25, q=2)

  @jax.jit
  def both(legs, weights):
    kw = dict(weights=weights, depths=[5, 4, 6], where=where, k0=10.0)
    out = [rrf.rrf_fuse(legs, **kw)]
    for temps in (COLD, [None, COLD, None]):
      out.append(rrf.soft_rrf_fuse(legs, temperature=temps, depth_temperature=COLD, candidates=candidates, **kw))
    # a relaxed greedy leg at a cold temperature is its hard twin (picks ranked 1..K)
    picks = greedy.selection_scores(cfs.cfs_select(qs, docs, k=6, where=where[0]), n=25)
    soft_sel = cfs.soft_cfs_select(qs, docs, k=6, temperature=COLD, where=where[0])
    kw = dict(weights=weights[:2], depths=[5, 4], where=where, k0=10.0)
    out.append(rrf.rrf_fuse(jnp.stack([legs[0], picks]), **kw))
    out.append(
      rrf.soft_rrf_fuse(
        [legs[0], soft_sel], temperature=[COLD, None], depth_temperature=COLD, candidates=candidates, **kw
      )
    )
    return out

  hard, soft1, soft2, hard_sel, soft_sel = both(legs, np.array([1.0, 0.5, 3.0]))
  np.testing.assert_allclose(soft1, hard, atol=1e-9)
  np.testing.assert_allclose(soft2, hard, atol=1e-9)
  np.testing.assert_allclose(soft_sel, hard_sel, atol=1e-9)


@pytest.mark.slow  # heavy compile: the fast tier keeps this module's lighter tests and test_registry_twins
def test_check_grads_soft_rrf():
  rng = np.random.default_rng(3)
  legs = rng.normal(size=(2, 2, 15))
  const = rng.normal(size=(2, 15))

  def f(scores, w, k0):
    return rrf.soft_rrf_fuse(
      [scores[0], scores[1], const],
      weights=w,
      depths=[4, 6, 5],
      k0=k0,
      temperature=[0.3, 0.5, None],
      depth_temperature=0.5,
      candidates=10,
    )

  def g(scores, w, k0):  # plus the dense path (no candidates)
    return f(scores, w, k0), rrf.soft_rrf_fuse(scores, weights=w[:2], depths=[4, 6], k0=k0, temperature=0.3)

  ops_testing.grads_ok(g, (legs, np.array([1.0, 2.0, 0.5]), 7.0))
