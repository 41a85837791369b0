"""Cosine: JAX equals the NumPy reference; jit / eager / vmap and all-masked lists; its registry declaration."""

import numpy as np
import ops_testing
import strategies
from hypothesis import given

from engram_jax.ops import cosine
from engram_jax.testing import reference as ref


@given(strategies.unit_vectors())
def test_cosine_matches_reference(qd):
  q, docs = qd
  np.testing.assert_allclose(cosine.cosine_scores(q, docs), ref.cosine(q, docs), atol=1e-12)


def test_jit_eager_vmap_and_all_masked():
  c = ops_testing.jit_case()
  ops_testing.check_jit_eager_vmap_and_all_masked(
    lambda x, w: cosine.cosine_scores(x, c['docs'], where=w), c['queries'], n=c['n'], qn=c['qn']
  )


def test_declaration():
  ops_testing.check_declaration('cosine')
