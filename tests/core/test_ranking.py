"""The shared tie rule (engram_jax.core.ranking): ranks and top-k against the NumPy reference."""

import jax.numpy as jnp
import numpy as np
import strategies
from hypothesis import given
from hypothesis import strategies as st

from engram_jax.core import ranking
from engram_jax.testing import reference as ref


def test_top_k_tie_rule_prefers_later_item():
  idx, vals = ranking.top_k(jnp.array([1.0, 2.0, 2.0, 0.5]), k=3)
  np.testing.assert_array_equal(idx, [2, 1, 0])
  np.testing.assert_array_equal(ranking.ranks(jnp.array([0.0, 0.0, 0.0])), [3, 2, 1])


@given(st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0]), min_size=1, max_size=30), st.data())
def test_ranks_and_top_k_match_reference(scores, data):
  where = np.array(data.draw(strategies.masks(len(scores))))
  s = np.array(scores)
  order = ref.order_with_ties(s, where)
  r = np.asarray(ranking.ranks(jnp.asarray(s), where=jnp.asarray(where)))
  np.testing.assert_array_equal([r[i] for i in order], np.arange(1, len(order) + 1))
  assert np.all(r[~where] > len(order))
  k = len(scores)
  idx, vals = ranking.top_k(jnp.asarray(s), k=k, where=jnp.asarray(where))
  np.testing.assert_array_equal(np.asarray(idx)[: len(order)], order)
  assert np.all(np.isneginf(np.asarray(vals)[len(order) :]))
