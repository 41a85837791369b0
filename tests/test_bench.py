"""The bench iterates the operator registry: every operator gets a row, references agree, the CLI runs."""

import numpy as np
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


# ---- scale: operator cost versus episode size N ----------------------------------------------------------------


def test_scale_episode_is_synthetic_and_reproducible():
  b = bench.scale_episode(50, 6, dim=16, vocab=200)
  assert b.docs.shape == (50, 16) and b.queries.shape == (6, 16) and b.docs.dtype == np.float32
  np.testing.assert_allclose(np.linalg.norm(b.docs, axis=-1), 1.0, rtol=1e-5)
  lengths = [len(it.text.split()) for it in b.episode.items]
  assert min(lengths) >= 20 and max(lengths) <= 30
  assert all(len(q.text.split()) == 8 for q in b.episode.questions)
  again = bench.scale_episode(50, 6, dim=16, vocab=200)
  np.testing.assert_array_equal(again.docs, b.docs)
  assert [q.text for q in again.episode.questions] == [q.text for q in b.episode.questions]
  bare = bench.scale_episode(50, 6, dim=16, vocab=200, texts=False)
  np.testing.assert_array_equal(bare.docs, b.docs)
  assert all(it.text == '' for it in bare.episode.items)


def test_growth_exponent_is_the_log_log_slope():
  assert bench.growth_exponent([1e3, 1e4, 1e5], [2e-6, 2e-5, 2e-4]) == pytest.approx(1.0)
  assert bench.growth_exponent([1e3, 1e4], [1e-6, 1e-4]) == pytest.approx(2.0)
  assert bench.growth_exponent([1e3], [1e-6]) is None


def test_scale_table_rows_memory_and_the_check_at_small_n():
  ops = list(bench.SCALE_OPS)
  result = bench.time_scale([60, 130], ops, n_queries=4, dim=16, rounds=1, repeats=1, check_n=520)
  rows = result['rows']
  assert [(r['op'], r['n']) for r in rows] == [(o, n) for n in (60, 130) for o in ops]
  for r in rows:
    assert r['skipped'] is None and len(r['per_query_rounds']) == 1 and r['per_query'] > 0
    assert r['memory'] is None or (r['memory']['peak'] >= r['memory']['args'] > 0)
  assert all(r['n_pad'] >= r['n'] for r in rows)
  for name in ops:
    assert result['ops'][name]['fit_ns'] == [60, 130] and result['ops'][name]['exponent'] is not None
    assert result['check'][name] == (4, 4), name  # the large-N branch equals the ordinary path at N = 520
  table = bench.format_scale(result, threads='threads: test')
  assert '| op | N | N padded | ms / query | XLA peak MB | temps MB |' in table and 'threads: test' in table
  assert '| cfsr | 130 |' in table and 'growth exponent' in table and '| 4/4 |' in table


def test_scale_skips_text_operators_over_the_dense_budget(monkeypatch):
  monkeypatch.setattr(bench, 'term_layout', lambda: bench.TermLayout(True, 4))
  result = bench.time_scale([60], ['cosine', 'rrf', 'tide'], n_queries=4, dim=16, rounds=1, repeats=1,
                            dense_budget_gb=1e-6, check_n=None)
  by_op = {r['op']: r for r in result['rows']}
  assert 'dense [N, V] term counts would need' in by_op['rrf']['skipped'] and by_op['rrf']['per_query'] is None
  assert by_op['cosine']['skipped'] is None and by_op['tide']['per_query'] > 0  # run on the text-free copy
  assert result['ops']['rrf']['exponent'] is None and result['check'] is None
  assert 'skipped: dense [N, V]' in bench.format_scale(result, threads='')


def test_scale_cli_writes_the_table(tmp_path, capsys):
  out = tmp_path / 'scale.md'
  result = bench.main(['--scale', '--scale-n', '50,70', '--scale-queries', '2', '--scale-ops', 'cosine,cfsr',
                       '--rounds', '1', '--repeats', '1', '--check-n', '0', '--out', str(out)])
  printed = capsys.readouterr().out
  assert [r['op'] for r in result['rows']] == ['cosine', 'cfsr', 'cosine', 'cfsr'] and len(result['rows'][0][
      'per_query_rounds']) == 3  # at least 3 rounds
  assert 'threads:' in printed and '| cfsr | 70 |' in printed
  assert '| cfsr | 70 |' in out.read_text() and out.with_suffix('.json').is_file()
  with pytest.raises(SystemExit):
    bench.main(['--scale', '--scale-ops', 'nope'])
