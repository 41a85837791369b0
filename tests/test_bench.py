"""The bench iterates the operator registry: every operator gets a row, references agree, the CLI runs."""

import pytest

from engram_jax.data import io
from engram_jax.ops import OPERATORS
from experiments import bench


@pytest.fixture(scope='module')
def episodes():
  return bench.synthetic_episodes(n_episodes=2, n_queries=6, dim=16, n_items=(40, 70))


def test_every_registered_operator_and_the_fusion_get_a_row(episodes):
  rows = bench.time_operators(episodes, repeats=1, rounds=2, ref_queries=3, peers=False)
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
  rows = bench.main(['--episodes', '1', '--queries', '4', '--repeats', '1', '--rounds', '1', '--ref-queries', '2',
                     '--ops', 'cosine,cos2,rrf', '--set', 'cos2.eps=0.1', '--cfsr-batch', '0'])
  out = capsys.readouterr().out
  assert [r['op'] for r in rows] == ['cosine', 'cos2', 'rrf'] and rows[1]['options']['eps'] == 0.1
  assert 'device' in out and 'threads:' in out
  assert '| op | JAX ms | reference / peer ms | ratio | agree |' in out and '| cos2 |' in out and 'n/a' in out
  assert out.count('threads:') == 2  # the environment header, and the thread settings under the table
  with pytest.raises(SystemExit):
    bench.main(['--ops', 'nope'])


def test_interleaved_rounds_give_one_sample_per_round_and_the_bm25_peers(episodes):
  rows = bench.time_operators(episodes, ['bm25', 'cosine'], repeats=1, rounds=3, ref_queries=2)
  by_op = {r['op']: r for r in rows}
  assert [r['op'] for r in rows][:2] == ['bm25', 'cosine'] and 'bm25 (rank_bm25)' in by_op and 'bm25 (bm25s)' in by_op
  for name in ('bm25', 'cosine'):
    r = by_op[name]
    assert len(r['jax_rounds']) == len(r['ref_rounds']) == len(r['ratio_rounds']) == 3
    assert all(t > 0 for t in r['jax_rounds'] + r['ref_rounds']) and r['checked'] == 4
    assert r['jax_s'] == pytest.approx(sorted(r['jax_rounds'])[1]) and r['ratio'] == pytest.approx(
        sorted(r['ratio_rounds'])[1])
  peer = by_op['bm25 (rank_bm25)']
  assert peer['peer_of'] == 'bm25' and peer['jax_rounds'] == by_op['bm25']['jax_rounds']
  assert len(peer['ref_rounds']) == 3 and all(t > 0 for t in peer['ref_rounds']) and peer['ratio'] > 0
  assert peer['checked'] == 12 and peer['agree'] == 12  # rank_bm25 is the semantics the JAX leg reproduces
  assert 0 <= peer['high_df_queries'] <= 12
  assert peer['options'] == {k: by_op['bm25']['options'][k] for k in ('k1', 'b', 'epsilon')}
  table = bench.format_table(rows, n_episodes=2, n_queries=12, threads='threads: test')
  assert '| bm25 (rank_bm25) |' in table and '| bm25 (bm25s) |' in table and 'threads: test' in table
  assert '3 interleaved rounds' in table
  s = by_op['bm25 (bm25s)']
  try:
    import bm25s  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  except ImportError:
    assert s['unavailable'] and s['ref_s'] is None and 'unavailable' in table
  else:
    assert s['unavailable'] is None and len(s['ref_rounds']) == 3 and s['ratio'] > 0 and s['checked'] == 12


def test_an_unavailable_peer_is_reported_not_fatal(episodes, monkeypatch):
  monkeypatch.setitem(bench.PEERS, 'bm25s', lambda: bench.Peer('bm25 (bm25s)', None, 'bm25s not installed'))
  rows = bench.time_operators(episodes[:1], ['bm25'], repeats=1, rounds=1, ref_queries=1)
  assert [r['op'] for r in rows] == ['bm25', 'bm25 (rank_bm25)', 'bm25 (bm25s)']
  assert rows[2]['unavailable'] == 'bm25s not installed' and rows[2]['ratio'] is None
  assert '| bm25 (bm25s) |' in bench.format_table(rows, n_episodes=1, n_queries=6) and 'unavailable' in (
      bench.format_table(rows, n_episodes=1, n_queries=6))
  assert bench.time_operators(episodes[:1], ['cosine'], repeats=1, rounds=1)[0]['op'] == 'cosine'  # no bm25: no peers


def _have_locomo() -> bool:
  try:
    return (io.resolve_data_root() / 'locomo' / 'locomo10.json').is_file()
  except FileNotFoundError:
    return False


@pytest.mark.skipif(not _have_locomo(), reason='LoCoMo not found under the data root')
def test_harness_times_the_whole_evaluation_path(tmp_path):
  rows = bench.harness(['embedder=hashing', 'dataset.loader.conversations=[conv-30]', 'eval.n_resamples=100',
                        f'paths.cache_dir={tmp_path}/cache'], rounds=2, out_dir=str(tmp_path / 'out'))
  assert [r['round'] for r in rows] == [0, 1]
  assert rows[1]['xla_compilations'] == 0  # the persistent compilation cache serves the second round
  for r in rows:
    assert r['retrieve_s'] > 0 and r['wall_s'] >= sum(r['phases_s'].values()) - 1e-6
    assert r['overhead_ratio'] == pytest.approx(r['wall_s'] / r['retrieve_s'])
  assert 'overhead ratio' in bench.format_harness(rows)
