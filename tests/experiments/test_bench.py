"""The bench iterates the operator registry: every operator gets a row, references agree, the CLI runs; the harness
and the scale table."""

import numpy as np
import pytest
from run_script import script_result

from engram_jax.core import batch
from engram_jax.data import io
from engram_jax.ops import OPERATORS
from engram_jax.ops import bm25 as bm25_ops
from engram_jax.testing.synthetic import synthetic_episodes
from experiments.bench import cli, device, floor, harness, operators, scale


@pytest.fixture(scope='module')
def episodes():
  return synthetic_episodes(n_episodes=2, n_queries=6, dim=16, n_items=(40, 70))


@pytest.mark.slow
def test_every_registered_operator_and_the_fusion_get_a_row(episodes):
  rows = operators.time_operators(episodes, repeats=1, rounds=2, ref_queries=3, peers=False)
  assert [r['op'] for r in rows] == [
    *(o for o in OPERATORS if o != 'trec_run'),
    *operators.ROWS,
    operators.FUSION,
  ]  # trec_run needs a run file
  for r in rows:
    assert r['jax_s'] > 0 and r['episodes'] == 2 and r['queries'] == 12
    if r['op'] == operators.FUSION or operators.reference(operators.row_operator(r['op']), r['options']):
      assert r['ref_s'] > 0 and r['ratio'] > 0 and r['checked'] == 6
      assert r['agree'] == r['checked'], r['op']
    else:
      assert r['ref_s'] is None and r['ratio'] is None
  by_op = {r['op']: r for r in rows}
  assert by_op['tide']['options']['pool'] == 50 and by_op['mmr']['options']['pool'] == 50  # locked setups
  assert by_op['bm25']['ref_s'] > 0 and by_op['bm25_lucene_exact']['ref_s'] is None  # Okapi's reference only


def test_episodes_are_padded_with_the_evaluations_buckets():
  eps = synthetic_episodes(n_episodes=1, n_queries=70, dim=16, n_items=(40, 40))
  lines = []
  operators.time_operators(eps, ['cosine'], repeats=1, rounds=1, ref_queries=1, log=lines.append)
  arr = batch.episode_arrays(eps[0].episode, eps[0].docs, eps[0].queries)  # default buckets, as evaluate's
  assert arr.queries.shape[0] == 128 and 'N=40 (padded 64), Q=70 (padded 128)' in lines[0]


def test_overrides_are_validated_by_the_declaration(episodes):
  (row,) = operators.time_operators(episodes[:1], ['tide'], repeats=1, overrides={'tide': {'pool': 5}})
  assert row['options']['pool'] == 5 and row['agree'] == row['checked']
  with pytest.raises(ValueError, match='pool must be an integer >= 1'):
    operators.time_operators(episodes[:1], ['tide'], repeats=1, overrides={'tide': {'pool': 0}})
  with pytest.raises(ValueError, match='unknown operators'):
    operators.time_operators(episodes[:1], ['nope'], repeats=1)


@pytest.mark.slow  # heavy compile: the fast tier keeps this module's lighter tests and test_registry_twins
def test_cli_prints_the_environment_and_the_table(capsys):
  rows = cli.main(
    [
      '--episodes',
      '1',
      '--queries',
      '4',
      '--repeats',
      '1',
      '--rounds',
      '1',
      '--ref-queries',
      '2',
      '--ops',
      'cosine,cos2,rrf',
      '--set',
      'cos2.eps=0.1',
      '--cfsr-batch',
      '0',
    ]
  )
  out = capsys.readouterr().out
  assert [r['op'] for r in rows] == ['cosine', 'cos2', 'rrf'] and rows[1]['options']['eps'] == 0.1
  assert 'device' in out and 'threads:' in out
  assert (
    '| op | JAX ms | reference / peer ms | ratio | agree | solve work' in out and '| cos2 |' in out and 'n/a' in out
  )
  assert out.count('threads:') == 2  # the environment header, and the thread settings under the table
  with pytest.raises(SystemExit):
    cli.main(['--ops', 'nope'])
  with pytest.raises(SystemExit):
    cli.main(['--ops', 'bm25', '--set', 'nope.k1=1.0'])
  rows = cli.main(
    ['--episodes', '1', '--queries', '4', '--repeats', '1', '--rounds', '1', '--ops', 'bm25_lucene_exact']
    + ['--set', 'bm25_lucene_exact.b=0.5', '--cpu-devices', '1']
  )
  out = capsys.readouterr().out
  assert [r['op'] for r in rows] == ['bm25_lucene_exact', 'bm25_lucene_exact (bm25s)']
  assert rows[0]['options']['b'] == rows[1]['options']['b'] == 0.5
  assert '| bm25_lucene_exact (bm25s) | (bm25_lucene_exact) ' in out


def test_interleaved_rounds_give_one_sample_per_round_and_the_bm25_peers(episodes):
  rows = operators.time_operators(episodes, ['bm25', 'cosine'], repeats=1, rounds=3, ref_queries=2)
  by_op = {r['op']: r for r in rows}
  assert [r['op'] for r in rows][:2] == ['bm25', 'cosine'] and 'bm25 (rank_bm25)' in by_op and 'bm25 (bm25s)' in by_op
  for name in ('bm25', 'cosine'):
    r = by_op[name]
    assert len(r['jax_rounds']) == len(r['ref_rounds']) == len(r['ratio_rounds']) == 3
    assert all(t > 0 for t in r['jax_rounds'] + r['ref_rounds']) and r['checked'] == 4
    assert r['jax_s'] == pytest.approx(sorted(r['jax_rounds'])[1]) and r['ratio'] == pytest.approx(
      sorted(r['ratio_rounds'])[1]
    )
  peer = by_op['bm25 (rank_bm25)']
  assert peer['peer_of'] == 'bm25' and peer['jax_rounds'] == by_op['bm25']['jax_rounds']
  assert len(peer['ref_rounds']) == 3 and all(t > 0 for t in peer['ref_rounds']) and peer['ratio'] > 0
  assert peer['checked'] == 12 and peer['agree'] == 12  # rank_bm25 is the semantics the JAX leg reproduces
  assert 0 <= peer['high_df_queries'] <= 12
  assert peer['options'] == {k: by_op['bm25']['options'][k] for k in ('k1', 'b', 'epsilon', 'tokenizer')}
  table = operators.format_table(rows, n_episodes=2, n_queries=12, threads='threads: test')
  assert '| bm25 (rank_bm25) |' in table and '| bm25 (bm25s) |' in table and 'threads: test' in table
  assert '3 interleaved rounds' in table
  s = by_op['bm25 (bm25s)']
  try:
    import bm25s  # noqa: F401
  except ImportError:
    assert s['unavailable'] and s['ref_s'] is None and 'unavailable' in table
  else:
    assert s['unavailable'] is None and len(s['ref_rounds']) == 3 and s['ratio'] > 0 and s['checked'] == 12


def test_an_unavailable_peer_is_reported_not_fatal(episodes, monkeypatch):
  monkeypatch.setitem(operators.PEERS, 'bm25s', lambda: operators.Peer('bm25 (bm25s)', None, 'bm25s not installed'))
  rows = operators.time_operators(episodes[:1], ['bm25'], repeats=1, rounds=1, ref_queries=1)
  assert [r['op'] for r in rows] == ['bm25', 'bm25 (rank_bm25)', 'bm25 (bm25s)']
  assert rows[2]['unavailable'] == 'bm25s not installed' and rows[2]['ratio'] is None
  assert '| bm25 (bm25s) |' in operators.format_table(rows, n_episodes=1, n_queries=6) and 'unavailable' in (
    operators.format_table(rows, n_episodes=1, n_queries=6)
  )
  assert (
    operators.time_operators(episodes[:1], ['cosine'], repeats=1, rounds=1)[0]['op'] == 'cosine'
  )  # no bm25: no peers


def test_the_lucene_row_is_timed_against_bm25s_on_its_analyzers_tokens(episodes):
  """bm25_lucene_exact: BM25 form lucene_exact on the english analyzer, k1 0.9, b 0.4, against bm25s
  method='lucene' indexed on the same analyzer's tokens: the same scores up to float32 rounding, so the same top-10;
  no NumPy reference of that form (n/a)."""
  rows = operators.time_operators(episodes, ['bm25_lucene_exact'], repeats=1, rounds=2, ref_queries=2)
  assert [r['op'] for r in rows] == ['bm25_lucene_exact', 'bm25_lucene_exact (bm25s)']
  row, peer = rows
  assert {k: row['options'][k] for k in ('tokenizer', 'form', 'k1', 'b')} == {
    'tokenizer': 'english',
    'form': 'lucene_exact',
    'k1': 0.9,
    'b': 0.4,
  }
  assert row['ref_s'] is None and row['ratio'] is None and row['checked'] == 0 and row['jax_s'] > 0
  assert peer['peer_of'] == 'bm25_lucene_exact' and peer['unavailable'] is None
  assert peer['options'] == {k: row['options'][k] for k in ('k1', 'b', 'epsilon', 'tokenizer')}
  assert peer['jax_rounds'] == row['jax_rounds'] and len(peer['ref_rounds']) == 2 and peer['ratio'] > 0
  assert peer['checked'] == 12 and peer['agree'] == 12
  table = operators.format_table(rows, n_episodes=2, n_queries=12, threads='')
  assert '| bm25_lucene_exact | ' in table and '| n/a | n/a | n/a |' in table
  assert '| bm25_lucene_exact (bm25s) | (bm25_lucene_exact) ' in table and 'bm25s method=lucene' in table
  assert 'bm25 with tokenizer=english, form=lucene_exact, k1=0.9, b=0.4' in table

  # the peer's scores are the JAX leg's, both on the english analyzer's tokens
  b = episodes[0]
  e = operators.ref_episode(b, ['english'])
  assert e.tokens['english'][0][0] == bm25_ops.ANALYZERS['english'](b.episode.items[0].text)
  assert e.doc_tokens == [bm25_ops.tokenize(it.text) for it in b.episode.items]  # 'words', as before
  (p,) = operators.available_peers('bm25_lucene_exact')
  score = p.build(e.tokens['english'][0], 0.9, 0.4, 0.25)
  arr = batch.episode_arrays(b.episode, b.docs, b.queries, tokenizers=['english'])
  got = np.asarray(bm25_ops.bm25_leg(arr, None, k1=0.9, b=0.4, tokenizer='english', form='lucene_exact'))
  got = got[: len(b.episode.questions), : b.episode.n_items]
  want = np.stack([score(toks) for toks in e.tokens['english'][1]])
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

  # a knob of the named row is set by its name; the peer follows
  rows = operators.time_operators(
    episodes[:1], ['bm25_lucene_exact'], repeats=1, rounds=1, overrides={'bm25_lucene_exact': {'k1': 1.2}}
  )
  assert rows[0]['options']['k1'] == 1.2 and rows[0]['options']['tokenizer'] == 'english'
  assert rows[1]['options']['k1'] == 1.2 and rows[1]['agree'] == rows[1]['checked'] == 6


def test_the_bm25_reference_and_peers_read_the_rows_analyzer(episodes):
  """The okapi reference and rank_bm25 take the tokens of the bm25 row's analyzer; a peer of another form than its
  row's is reported unavailable, and a form the reference lacks prints n/a."""
  rows = operators.time_operators(
    episodes[:1], ['bm25'], repeats=1, rounds=1, ref_queries=3, overrides={'bm25': {'tokenizer': 'english'}}
  )
  by_op = {r['op']: r for r in rows}
  assert by_op['bm25']['ref_s'] > 0 and by_op['bm25']['agree'] == by_op['bm25']['checked'] == 3
  assert by_op['bm25 (rank_bm25)']['options']['tokenizer'] == 'english'
  assert by_op['bm25 (rank_bm25)']['agree'] == by_op['bm25 (rank_bm25)']['checked'] == 6
  rows = operators.time_operators(
    episodes[:1], ['bm25'], repeats=1, rounds=1, ref_queries=3, overrides={'bm25': {'form': 'lucene_exact'}}
  )
  assert rows[0]['ref_s'] is None and rows[0]['ratio'] is None
  for r in rows[1:]:
    assert "computes BM25's 'okapi' form; the bm25 row runs 'lucene_exact'" in r['unavailable']
    assert r['ref_s'] is None and r['ratio'] is None and r['checked'] == 0
  assert 'unavailable' in operators.format_table(rows, n_episodes=1, n_queries=6, threads='')
  with pytest.raises(ValueError, match='unknown operators'):
    operators.time_operators(episodes[:1], ['bm25'], repeats=1, overrides={'bm25_okapi': {'k1': 1.0}})


def _have_locomo() -> bool:
  try:
    return (io.resolve_data_root() / 'locomo' / 'locomo10.json').is_file()
  except FileNotFoundError:
    return False


@pytest.mark.slow
@pytest.mark.skipif(not _have_locomo(), reason='LoCoMo not found under the data root')
def test_harness_times_the_whole_evaluation_path(tmp_path):
  rows = harness.harness(
    [
      'embedder=hashing',
      'dataset.loader.conversations=[conv-30]',
      'eval.n_resamples=100',
      f'paths.cache_dir={tmp_path}/cache',
    ],
    rounds=2,
    out_dir=str(tmp_path / 'out'),
  )
  assert [r['round'] for r in rows] == [0, 1]
  assert rows[1]['xla_compilations'] == 0  # the persistent compilation cache serves the second round
  for r in rows:
    assert r['retrieve_s'] > 0 and r['wall_s'] >= sum(r['phases_s'].values()) - 1e-6
    assert r['overhead_ratio'] == pytest.approx(r['wall_s'] / r['retrieve_s'])
  assert 'overhead ratio' in harness.format_harness(rows)


# ---- scale: operator cost versus episode size N ----------------------------------------------------------------


def test_growth_exponent_is_the_log_log_slope():
  assert scale.growth_exponent([1e3, 1e4, 1e5], [2e-6, 2e-5, 2e-4]) == pytest.approx(1.0)
  assert scale.growth_exponent([1e3, 1e4], [1e-6, 1e-4]) == pytest.approx(2.0)
  assert scale.growth_exponent([1e3], [1e-6]) is None


@pytest.mark.slow
def test_scale_table_rows_memory_and_the_check_at_small_n():
  ops = list(scale.SCALE_OPS)
  result = scale.time_scale([60, 130], ops, n_queries=4, dim=16, rounds=1, repeats=1, check_n=520)
  rows = result['rows']
  assert [(r['op'], r['n']) for r in rows] == [(o, n) for n in (60, 130) for o in ops]
  for r in rows:
    assert r['skipped'] is None and len(r['per_query_rounds']) == 1 and r['per_query'] > 0
    assert r['memory'] is None or (r['memory']['peak'] >= r['memory']['args'] > 0)
  assert all(r['n_pad'] >= r['n'] for r in rows)
  for name in ops:
    assert result['ops'][name]['fit_ns'] == [60, 130] and result['ops'][name]['exponent'] is not None
    assert result['check'][name] == (4, 4), name  # the large-N branch equals the ordinary path at N = 520
  table = scale.format_scale(result, threads='threads: test')
  assert '| op | N | N padded | ms / query | XLA peak MB | temps MB |' in table and 'threads: test' in table
  assert '| cfsr | 130 |' in table and 'growth exponent' in table and '| 4/4 |' in table


def test_scale_skips_text_operators_over_the_dense_budget(monkeypatch):
  monkeypatch.setattr(scale, 'term_layout', lambda: scale.TermLayout(True, 4))
  result = scale.time_scale(
    [60], ['cosine', 'rrf', 'tide'], n_queries=4, dim=16, rounds=1, repeats=1, dense_budget_gb=1e-6, check_n=None
  )
  by_op = {r['op']: r for r in result['rows']}
  assert 'dense [N, V] term counts would need' in by_op['rrf']['skipped'] and by_op['rrf']['per_query'] is None
  assert by_op['cosine']['skipped'] is None and by_op['tide']['per_query'] > 0  # run on the text-free copy
  assert result['ops']['rrf']['exponent'] is None and result['check'] is None
  assert 'skipped: dense [N, V]' in scale.format_scale(result, threads='')


@pytest.mark.slow  # heavy compile: the fast tier keeps this module's lighter tests and test_registry_twins
def test_scale_cli_writes_the_table(tmp_path, capsys):
  out = tmp_path / 'scale.md'
  result = cli.main(
    [
      '--scale',
      '--scale-n',
      '50,70',
      '--scale-queries',
      '2',
      '--scale-ops',
      'cosine,cfsr',
      '--rounds',
      '1',
      '--repeats',
      '1',
      '--check-n',
      '0',
      '--out',
      str(out),
    ]
  )
  printed = capsys.readouterr().out
  assert [r['op'] for r in result['rows']] == ['cosine', 'cfsr', 'cosine', 'cfsr'] and len(
    result['rows'][0]['per_query_rounds']
  ) == 3  # at least 3 rounds
  assert 'threads:' in printed and '| cfsr | 70 |' in printed
  assert '| cfsr | 70 |' in out.read_text() and out.with_suffix('.json').is_file()
  with pytest.raises(SystemExit):
    cli.main(['--scale', '--scale-ops', 'nope'])


# ---- the CFS-R floor --------------------------------------------------------------------------------------------


def test_cfsr_floor_times_the_leg_its_parts_and_a_matmul_of_the_same_flops():
  eps = synthetic_episodes(n_episodes=1, n_queries=4, dim=16, n_items=(40, 40))
  r = floor.cfsr_floor(eps, repeats=1, batch_size=2, pool=10, iterations=5, power_iterations=3)
  assert r['n_queries'] == 4 and r['pool'] == 10
  assert set(r['seconds']) == {'leg', 'pool', 'pool: top-P', 'power', 'solve', 'gemm', 'read', 'blas'}
  assert all(t > 0 for t in r['seconds'].values())
  assert r['gflop'] == pytest.approx(2 * 10**2 * (5 + 3) * 4 / 1e9)
  table = floor.format_cfsr_floor(r)
  assert '| solve |' in table and "floor at this machine's dense-matmul rate" in table
  assert 'profile: pool' in table and 'power iteration' in table and 'projected gradient' in table
  assert '| read |' in table and 'fused add-and-reduce' in table
  assert '| blas |' in table and 'OpenBLAS reads the same blocks' in table and f'all {r["devices"]} device' in table


def test_episodes_are_dealt_largest_first_to_the_least_loaded_device():
  assert operators.deal_episodes([10, 40, 30, 20], 2) == [0, 0, 1, 1]
  assert operators.deal_episodes([5, 5, 5], 3) == [0, 1, 2]
  assert operators.deal_episodes([], 2) == []


SPREAD = """
import contextlib, io, json
from experiments.bench import cli
captured = io.StringIO()
with contextlib.redirect_stdout(captured):
  rows = cli.main(['--episodes', '3', '--queries', '6', '--repeats', '1', '--rounds', '2', '--ops', 'cosine,cfsr,rrf',
                 '--no-peers', '--ref-queries', '2', '--cpu-devices', '2'])
table = [l for l in captured.getvalue().splitlines() if l.startswith('| op |')]
print('RESULT ' + json.dumps([[{k: r[k] for k in ('op', 'devices', 'all_rounds', 'ratio_all')} for r in rows], table]))
"""


@pytest.mark.slow
def test_with_two_devices_the_table_times_every_episode_at_once():
  rows, printed = script_result(SPREAD)
  assert [r['op'] for r in rows] == ['cosine', 'cfsr', 'rrf']
  for r in rows:  # the outputs on two devices equal one device's (the bench checks it, else it raises)
    assert r['devices'] == 2 and len(r['all_rounds']) == 2 and all(t > 0 for t in r['all_rounds'])
    assert r['ratio_all'] > 0
  assert '| JAX ms, 2 devices | ratio, 2 devices |' in printed[0]


def test_the_cfsr_family_rows_carry_their_solve_work():
  """FLOPs and bytes of the CFS-R solve: (20 power + iterations) matvecs of 2 P^2 FLOPs / 4 P^2 bytes per question,
  P = min(pool, N); printed beside the time (GFLOP/s = work / JAX median); other operators have none."""
  assert operators.solve_cost({'pool': 150, 'iterations': 80}, 600, 10) == (
    2.0 * 150**2 * 100 * 10,
    4.0 * 150**2 * 100 * 10,
  )
  assert operators.solve_cost({'pool': 150, 'iterations': 80}, 100, 1) == (2.0 * 100**2 * 100, 4.0 * 100**2 * 100)
  assert operators.solve_cost({'k1': 1.5}, 600, 10) is None
  row = {'op': 'cfsr', 'jax_s': 0.5, 'jax_rounds': [0.5], 'ref_s': None, 'ref_rounds': None, 'ratio_rounds': None}
  row.update({'gflop': 4.0, 'gbytes': 8.0, 'agree': 0, 'checked': 0})
  table = operators.format_table([row], n_episodes=1, n_queries=1, threads='')
  assert '| cfsr | 500.0 (500.0-500.0) | n/a | n/a | n/a | 4.00, 8.00 -> 8.0 |' in table, table


def test_device_check_comparison_counts_what_differs():
  want = {
    'default/cosine/0': np.array([[1, 2, 3], [4, 5, 6]]),
    'cfsr/0/ids': np.array([[1, 2], [3, 4]]),
    'cfsr/0/scores': np.array([[0.9, 0.5], [0.8, 0.1]], np.float32),
    'fit/loss': np.float32(0.5),
    'fit/legs.cfsr.lam': np.float32(-5.0),
  }
  same = device.compare(dict(want), want)
  assert same['default'] == {'questions': 2, 'same_ids': 2, 'max_diff': None}
  assert same['cfsr'] == {'questions': 2, 'same_ids': 2, 'max_diff': 0.0} and same['fit step']['max_diff'] == 0.0
  got = {
    **want,
    'default/cosine/0': np.array([[1, 2, 3], [4, 6, 5]]),
    'cfsr/0/scores': np.array([[0.9, 0.5], [0.8, 0.125]], np.float32),
    'fit/loss': np.float32(0.55),
  }
  diff = device.compare(got, want)
  assert diff['default']['same_ids'] == 1 and diff['cfsr']['same_ids'] == 2
  assert diff['cfsr']['max_diff'] == pytest.approx(0.025) and diff['fit step']['max_diff'] == pytest.approx(0.1)
  with pytest.raises(ValueError, match='the reference has results this run lacks'):
    device.compare({}, want)


@pytest.mark.slow  # compiles the default pipelines, CFS-R and a fit step twice (device, then CPU)
def test_device_check_runs_on_cpu_as_a_dry_run(tmp_path, capsys):
  """No GPU here: the default device is the CPU, so the check compares the CPU with itself (all equal), writes its
  results, and a second run compares with that file (``--reference``)."""
  args = ['--device-check', '--data', 'synthetic', '--episodes', '1', '--queries', '8', '--repeats', '1']
  r = cli.main(args + ['--out', str(tmp_path / 'cpu.npz')])
  out = capsys.readouterr().out
  assert '| part | device ms | CPU reference ms |' in out and '| cfsr |' in out and '| fit step |' in out
  c = r['comparison']
  assert c['default']['same_ids'] == c['default']['questions'] == 3 * 8
  assert c['cfsr']['same_ids'] == c['cfsr']['questions'] == 8 and c['cfsr']['max_diff'] == 0.0
  assert c['fit step']['max_diff'] == 0.0 and set(r['seconds']) == {'default', 'cfsr', 'fit step'}
  again = cli.main(args + ['--reference', str(tmp_path / 'cpu.npz')])
  assert again['comparison'] == c and again['reference_seconds'].keys() == r['seconds'].keys()
