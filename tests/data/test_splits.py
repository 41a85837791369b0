"""Pilot sets (committed, seeded, regenerable) and disjoint training splits."""

import collections

import pytest

from engram_jax.core.types import Episode, Item, LoadReport, Question
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


@pytest.mark.slow  # reads LongMemEval_S (~10 s)
@needs_data
def test_the_pinned_lme_parts_equal_todays_draw(tmp_path):
  """The committed train/confirm lists equal the parts drawn from our 498-question copy, so every lme_* protocol
  keeps its questions; written again, they are byte-identical."""
  paths = S.write_parts(root=REAL, pilot_dir=tmp_path)
  for name, path in paths.items():
    part = name.split('.')[-1]
    assert path.read_text() == S.part_path('longmemeval_s', part, 100, S.PILOT_SEED).read_text()
  assert len(S.pinned_part('longmemeval_s', 'train', 100, S.PILOT_SEED)) == 100


def _toy_load(ids):
  def load(root):
    eps = [
      Episode(
        id=i, items=(Item(f'{i}-0', f'text {i}', 'p', 0),), questions=(Question(i, f'q {i}', (f'{i}-0',), ('p',), 'c'),)
      )
      for i in ids
    ]
    report = LoadReport('toy')
    report.read_ids = frozenset(ids)
    return eps, report

  return load


def test_pinned_parts_do_not_move_with_the_file_and_missing_ids_are_named(monkeypatch, caplog):
  """With pinned lists a part is the same whatever the file holds (upstream's 500 questions, or a copy missing
  some): missing pinned questions are counted and logged, extra ones are in no part. Without pinned lists the
  training draw moves with the file's ids (the problem: 65 of 100 LongMemEval training ids would stay)."""
  ids = [f'q{i:03d}' for i in range(60)]
  pilot = ids[:10]
  drawn = S.drawn_parts(ids[10:], pilot=None, n_train=20, seed=3)
  pins = drawn
  monkeypatch.setattr(S, 'pilot_ids', lambda name: pilot)
  monkeypatch.setattr(S, 'pinned_part', lambda pilot, part, n, seed: pins[part])
  more = ids + ['x1', 'x2']  # a larger file
  fewer = [i for i in ids if i not in (pins['train'][0], pins['confirm'][0])]  # a damaged copy
  for data in (ids, more, fewer):
    for part in ('train', 'confirm'):
      eps, rep = S.load_part(load=_toy_load(data), part=part, pilot='p', n_train=20, seed=3)
      assert {e.id for e in eps} == set(pins[part]) & set(data)
  eps, rep = S.load_part(load=_toy_load(more), part='confirm', pilot='p', n_train=20, seed=3)
  assert rep.to_dict()['counts']['ids_in_no_pinned_part'] == 2
  with caplog.at_level('WARNING'):
    eps, rep = S.load_part(load=_toy_load(fewer), part='train', pilot='p', n_train=20, seed=3)
  assert f'1 of the 20 pinned train questions are not in the data: {pins["train"][0]}' in caplog.text
  monkeypatch.setattr(S, 'pinned_part', lambda *a: None)  # unpinned: the draw moves with the file
  a = S.load_part(load=_toy_load(ids), part='train', pilot='p', n_train=20, seed=3)[0]
  b = S.load_part(load=_toy_load(more), part='train', pilot='p', n_train=20, seed=3)[0]
  assert {e.id for e in a} != {e.id for e in b}
