"""experiments.lib.jsonfmt.dumps is json.dumps(indent=1) byte for byte: random JSON trees (nested, empty containers,
unicode, NaN/inf, int/float/bool/None keys, tuples), NumPy float64 scalars, and errors for what json refuses."""

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from experiments.lib import jsonfmt

SCALARS = st.none() | st.booleans() | st.integers(-(10**20), 10**20) | st.floats(allow_nan=True) | st.text(max_size=8)
KEYS = st.text(max_size=6) | st.integers(-5, 5) | st.floats(allow_nan=False) | st.booleans() | st.none()
TREES = st.recursive(
  SCALARS,
  lambda inner: st.lists(inner, max_size=5) | st.tuples(inner, inner) | st.dictionaries(KEYS, inner, max_size=5),
  max_leaves=40,
)


@given(TREES)
def test_equals_json_dumps_indent_1(tree):
  assert jsonfmt.dumps(tree) == json.dumps(tree, indent=1)


def test_numpy_float64_and_a_results_like_tree():
  rng = np.random.default_rng(0)
  tree = {
    'pipelines': {'a': {'ndcg@10': np.float64(0.25), 'ci95': {'ndcg@10': [0.1, 0.4]}}},
    'per_question': [
      {
        'id': f'q{i}',
        'retrieved': {'a': [f'D{j}' for j in range(10)]},
        'scores': {'a': {'ndcg@10': float(rng.uniform())}},
      }
      for i in range(50)
    ],
    'empty': {},
    'none': [],
    'nan': float('nan'),
    'text': 'caf\u00e9 "quoted"\n',
  }
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
  tree = {
    'rows': [
      {
        'id': Sub('q'),
        'ok': True,
        'n': 3,
        'v': np.float64(0.1),
        'nan': float('nan'),
        'e': {},
        'l': [],
        'ids': ['a', Sub('b')],
        'o': __import__('collections').OrderedDict(x=1),
      }
      for _ in range(3)
    ],
    'deep': deep,
    'mixed': [{'a': 1}, [1, 'b'], 'c', None],
  }
  assert jsonfmt.dumps(tree) == json.dumps(tree, indent=1)


@st.composite
def _records(draw, n=None, depth=0):
  """A list of records (dicts with the same keys in the same order; the keys may hold '%'), each column one kind:
  floats (NaN, inf), ints, bools, strings, lists of strings, records again, or anything; sometimes one record's keys
  reordered or renamed (no longer records)."""
  n = draw(st.integers(1, 5)) if n is None else n
  keys = draw(st.lists(st.text(alphabet='ab%s\u00e9"\\', max_size=3), min_size=1, max_size=4, unique=True))
  kinds = ['float', 'int', 'bool', 'str', 'strs', 'any'] + (['records'] if depth < 2 else [])
  columns = []
  for _ in keys:
    kind = draw(st.sampled_from(kinds))
    if kind == 'records':
      columns.append(draw(_records(n=n, depth=depth + 1)))
    else:
      one = {
        'float': st.floats(allow_nan=True),
        'int': st.integers(-(10**20), 10**20),
        'bool': st.booleans(),
        'str': st.text(max_size=5),
        'strs': st.lists(st.text(max_size=3), max_size=3),
        'any': TREES,
      }[kind]
      columns.append(draw(st.lists(one, min_size=n, max_size=n)))
  rows = [dict(zip(keys, values)) for values in zip(*columns)]
  change = draw(st.sampled_from(['none', 'none', 'reorder', 'rename']))
  if change == 'reorder' and len(keys) > 1:
    rows[-1] = dict(reversed(list(rows[-1].items())))
  elif change == 'rename':
    rows[-1] = {k + 'x': v for k, v in rows[-1].items()}
  return rows


@given(_records())
def test_records_equal_json_dumps_indent_1(rows):
  """Lists of records (written through one template per list) and of near-records (written dict by dict)."""
  tree = {'per_question': rows, 'nested': [{'rows': rows}]}
  assert jsonfmt.dumps(tree) == json.dumps(tree, indent=1)


def test_records_whose_keys_json_tells_apart():
  """``1 == True == 1.0`` as keys, but json writes them "1", "true", "1.0": not records; a str subclass key and
  empty dicts either."""

  class Sub(str):
    pass

  for rows in (
    [{1: 'a'}, {True: 'b'}, {1.0: 'c'}],
    [{'a': 1}, {Sub('a'): 2}],
    [{}, {}],
    [{'a': 1}, {}],
    [{'a': [1, 'x']}, {'a': ['y', Sub('z')]}, {'a': []}],
  ):
    assert jsonfmt.dumps(rows) == json.dumps(rows, indent=1)
