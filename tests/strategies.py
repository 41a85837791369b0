"""Hypothesis strategies shared by the operator tests."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from engram_jax.testing import reference as ref


@st.composite
def unit_vectors(draw, n_min=1, n_max=30, d_min=2, d_max=12, with_query=True):
  """(query [D], docs [N, D]) unit-norm float64 arrays."""
  n = draw(st.integers(n_min, n_max))
  d = draw(st.integers(d_min, d_max))
  seed = draw(st.integers(0, 2**31 - 1))
  rng = np.random.default_rng(seed)
  docs = rng.normal(size=(n, d))
  docs /= np.linalg.norm(docs, axis=1, keepdims=True)
  q = rng.normal(size=d)
  q /= np.linalg.norm(q)
  return q, docs


WORDS = ['cat', 'dog', 'the', 'a', 'kitchen', 'budget', 'paris', 'ran', 'blue', 'x', 'y', 'z']


@st.composite
def corpora(draw, n_min=1, n_max=25):
  """(query tokens, docs tokens): small random corpora over a tiny vocabulary (empty docs allowed)."""
  docs = draw(st.lists(st.lists(st.sampled_from(WORDS), min_size=0, max_size=12), min_size=n_min, max_size=n_max))
  query = draw(st.lists(st.sampled_from(WORDS + ['unseen']), min_size=0, max_size=8))
  return query, docs


def masks(n):
  return hnp.arrays(bool, n)


@st.composite
def padded_episodes(draw, *, n_pad, d_pad, q):
  """(docs [n_pad, d_pad], queries [q, d_pad], where [n_pad]): random unit-norm rows, N real in 1..n_pad,
  D in 2..d_pad (zero-padded). Continuous random data from a drawn seed, so there are no near-ties;
  masked rows hold junk unit vectors or NaN, scattered or trailing."""
  seed = draw(st.integers(0, 2**32 - 1))
  n = draw(st.integers(1, n_pad))
  d = draw(st.integers(2, d_pad))
  scatter = draw(st.booleans())
  nan_pad = draw(st.booleans())
  rng = np.random.default_rng(seed)
  docs = ref.pad(ref.unit_vectors(rng, n_pad, d), n_pad, d_pad)
  where = np.zeros(n_pad, bool)
  where[rng.choice(n_pad, n, replace=False) if scatter else np.arange(n)] = True
  if nan_pad:
    docs[~where] = np.nan
  queries = ref.pad(ref.unit_vectors(rng, q, d), q, d_pad)
  return docs, queries, where
