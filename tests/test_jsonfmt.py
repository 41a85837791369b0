"""engram_jax.jsonfmt.dumps is json.dumps(indent=1) byte for byte: random JSON trees (nested, empty containers,
unicode, NaN/inf, int/float/bool/None keys, tuples), NumPy float64 scalars, and errors for what json refuses."""

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engram_jax import jsonfmt

SCALARS = (st.none() | st.booleans() | st.integers(-10**20, 10**20) | st.floats(allow_nan=True)
           | st.text(max_size=8))
KEYS = st.text(max_size=6) | st.integers(-5, 5) | st.floats(allow_nan=False) | st.booleans() | st.none()
TREES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=5) | st.tuples(inner, inner)
                     | st.dictionaries(KEYS, inner, max_size=5), max_leaves=40)


@given(TREES)
def test_equals_json_dumps_indent_1(tree):
  assert jsonfmt.dumps(tree) == json.dumps(tree, indent=1)


def test_numpy_float64_and_a_results_like_tree():
  rng = np.random.default_rng(0)
  tree = {'pipelines': {'a': {'ndcg@10': np.float64(0.25), 'ci95': {'ndcg@10': [0.1, 0.4]}}},
          'per_question': [{'id': f'q{i}', 'retrieved': {'a': [f'D{j}' for j in range(10)]},
                            'scores': {'a': {'ndcg@10': float(rng.uniform())}}} for i in range(50)],
          'empty': {}, 'none': [], 'nan': float('nan'), 'text': 'caf\u00e9 "quoted"\n'}
  assert jsonfmt.dumps(tree) == json.dumps(tree, indent=1)


@pytest.mark.parametrize('bad', [{'a': np.float32(1.0)}, {'a': {1, 2}}, {(1, 2): 3}])
def test_refuses_what_json_refuses(bad):
  with pytest.raises(TypeError):
    json.dumps(bad, indent=1)
  with pytest.raises(TypeError):
    jsonfmt.dumps(bad)


def test_records_deep_nesting_and_subclasses():
  """The inline paths (records of dicts, lists of strings, finite floats) and what they hand on: NaN and numpy
  floats inside a dict, bools (not ints), dict and str subclasses, empty containers, nesting deeper than 64."""
  class Sub(str):
    pass
  deep: object = 1.5
  for i in range(70):
    deep = {f'k{i}': [deep, 'x']} if i % 2 else [deep, {}]
  tree = {'rows': [{'id': Sub('q'), 'ok': True, 'n': 3, 'v': np.float64(0.1), 'nan': float('nan'), 'e': {}, 'l': [],
                    'ids': ['a', Sub('b')], 'o': __import__('collections').OrderedDict(x=1)} for _ in range(3)],
          'deep': deep, 'mixed': [{'a': 1}, [1, 'b'], 'c', None]}
  assert jsonfmt.dumps(tree) == json.dumps(tree, indent=1)
