"""Pilot sets (committed, seeded, regenerable) and disjoint training splits."""

import collections

import pytest

from engram_jax.data import splits as S
from engram_jax.data.io import resolve_data_root


def test_committed_pilot_sets_have_the_documented_sizes():
  for name, n in S.PILOT_SIZES.items():
    ids = S.pilot_ids(name)
    assert len(ids) == n == len(set(ids)) and ids == sorted(ids)
  assert S.pilot_ids('factconsolidation_sh_6k') == sorted(f'factconsolidation_sh_6k_no{i}' for i in range(100))
  assert S.pilot_ids('factconsolidation_mh_6k') == sorted(f'factconsolidation_mh_6k_no{i}' for i in range(100))
  with pytest.raises(ValueError, match='Unknown pilot set'):
    S.pilot_ids('locomo')


def test_draw_ids_is_seeded_and_order_free():
  ids = [f'q{i}' for i in range(50)]
  a = S.draw_ids(ids, n=10, seed=S.PILOT_SEED)
  assert a == S.draw_ids(list(reversed(ids)) + ids[:5], n=10, seed=S.PILOT_SEED)
  assert a != S.draw_ids(ids, n=10, seed=1) and len(a) == 10 and a == sorted(a)
  with pytest.raises(ValueError, match='cannot draw 51 ids from 50'):
    S.draw_ids(ids, n=51, seed=0)


def test_disjoint_split():
  ids = [f'q{i}' for i in range(30)]
  scored = ids[:20]
  train = S.disjoint_split(ids, scored=scored, seed=7, n_train=6)
  assert len(train) == 6 and not set(train) & set(scored)
  assert train == S.disjoint_split(ids, scored=scored, seed=7, n_train=6)
  with pytest.raises(ValueError, match='only 10 ids lie outside'):
    S.disjoint_split(ids, scored=scored, seed=7, n_train=11)


def test_assert_disjoint_fires_naming_the_overlap():
  S.assert_disjoint(['a', 'b'], ['c'])
  with pytest.raises(ValueError, match='overlap the scored ids: b, d$'):
    S.assert_disjoint(['a', 'b', 'd'], ['d', 'b', 'z'])
  many = [f'q{i:02d}' for i in range(25)]
  with pytest.raises(ValueError, match=r'\(25 in all\)'):
    S.assert_disjoint(many, many)


def _real_root():
  try:
    root = resolve_data_root(None)
  except FileNotFoundError:
    return None
  ok = (root / 'longmemeval' / 'longmemeval_s_cleaned_498of500.json.gz').is_file() and (
    root / 'memoryagentbench' / 'factconsolidation_official_6k.json'
  ).is_file()
  return root if ok else None


REAL = _real_root()
needs_data = pytest.mark.skipif(
  REAL is None,
  reason='LongMemEval_S / FactConsolidation 6K data not found under '
  'the data root (set ENGRAM_DATA_ROOT); regeneration check skipped',
)


@pytest.mark.slow  # regenerates every committed split file
@needs_data
def test_regenerating_gives_the_committed_lists(tmp_path):
  from engram_jax.data.longmemeval import entry_skip_reason, read_longmemeval

  entries = read_longmemeval(REAL, split='s')
  lme = S.generate_pilot_ids('longmemeval_s', ids=[e['question_id'] for e in entries])
  assert lme == S.pilot_ids('longmemeval_s')
  for name in ('factconsolidation_sh_6k', 'factconsolidation_mh_6k'):
    assert S.generate_pilot_ids(name, root=REAL) == S.pilot_ids(name)
  # The pilot's scored count under the official skip rules (the Tide page's own draw had 83 of 100).
  by_id = {e['question_id']: e for e in entries}
  reasons = collections.Counter(entry_skip_reason(by_id[q]) for q in lme)
  assert reasons == {None: 76, 'no_user_evidence': 15, 'abstention': 9}
  # A training split for LongMemEval drawn outside the pilot.
  train = S.disjoint_split(by_id, scored=lme, seed=S.PILOT_SEED, n_train=100)
  S.assert_disjoint(train, lme)
