"""The bench iterates the operator registry: every operator gets a row, references agree, the CLI runs."""

import pytest

from engram_jax.ops import OPERATORS
from experiments import bench


@pytest.fixture(scope='module')
def episodes():
  return bench.synthetic_episodes(n_episodes=2, n_queries=6, dim=16, n_items=(40, 70))


def test_every_registered_operator_and_the_fusion_get_a_row(episodes):
  rows = bench.time_operators(episodes, repeats=1, ref_queries=3)
  assert [r['op'] for r in rows] == [*OPERATORS, bench.FUSION]
  for r in rows:
    assert r['jax_s'] > 0 and r['episodes'] == 2 and r['queries'] == 12
    if r['op'] in bench.REFERENCES or r['op'] == bench.FUSION:
      assert r['ref_s'] > 0 and r['ratio'] > 0 and r['checked'] == 6
      assert r['agree'] == r['checked'], r['op']
    else:
      assert r['ref_s'] is None and r['ratio'] is None
  by_op = {r['op']: r for r in rows}
  assert by_op['tide']['options']['pool'] == 50 and by_op['mmr']['options']['pool'] == 50  # locked setups


def test_overrides_are_validated_by_the_declaration(episodes):
  (row,) = bench.time_operators(episodes[:1], ['tide'], repeats=1, overrides={'tide': {'pool': 5}})
  assert row['options']['pool'] == 5 and row['agree'] == row['checked']
  with pytest.raises(ValueError, match='pool must be an integer >= 1'):
    bench.time_operators(episodes[:1], ['tide'], repeats=1, overrides={'tide': {'pool': 0}})
  with pytest.raises(ValueError, match='unknown operators'):
    bench.time_operators(episodes[:1], ['nope'], repeats=1)


def test_cli_prints_the_environment_and_the_table(capsys):
  rows = bench.main(['--episodes', '1', '--queries', '4', '--repeats', '1', '--ref-queries', '2',
                     '--ops', 'cosine,cos2,rrf', '--set', 'cos2.eps=0.1', '--cfsr-batch', '0'])
  out = capsys.readouterr().out
  assert [r['op'] for r in rows] == ['cosine', 'cos2', 'rrf'] and rows[1]['options']['eps'] == 0.1
  assert 'device' in out and 'threads:' in out
  assert '| op | JAX ms | NumPy ms | ratio | agree |' in out and '| cos2 |' in out and 'n/a' in out
  with pytest.raises(SystemExit):
    bench.main(['--ops', 'nope'])
