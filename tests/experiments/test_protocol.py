"""Protocols fixed in advance: committed before the run, scored once (refused again unless forced), recorded."""

import json
import subprocess

import pytest
from omegaconf import OmegaConf

from engram_jax.core.errors import EngramError
from engram_jax.core.types import Episode, Item, LoadReport, Question
from engram_jax.data import splits
from experiments.lib import protocol

REAL_DIRTY_FILES = protocol.dirty_files


@pytest.fixture(autouse=True)
def clean_checkout(monkeypatch):
  """These tests run in a working checkout (often dirty): its state is not theirs; the dirty-tree tests set it."""
  monkeypatch.setattr(protocol, 'dirty_files', lambda: [])


def _cfg(**kw):
  return OmegaConf.create({'protocol_name': None, 'protocol_force': False, **kw})


_FIXED = {'protocol_name': 'p'}  # the protocol's own configuration in these unit tests


def test_no_protocol_and_unknown_protocol(tmp_path):
  assert protocol.check(_cfg()) is None
  with pytest.raises(ValueError, match="Unknown protocol 'nope'"):
    protocol.check(_cfg(protocol_name='nope'), protocol_dir=tmp_path, fixed={})


def test_uncommitted_protocol_is_refused_unless_forced(tmp_path):
  (tmp_path / 'p.yaml').write_text('protocol_name: p\n')
  with pytest.raises(ValueError, match='not committed'):
    protocol.check(_cfg(protocol_name='p'), ledger=tmp_path / 'scored.jsonl', protocol_dir=tmp_path, fixed=_FIXED)
  info = protocol.check(
    _cfg(protocol_name='p', protocol_force=True), ledger=tmp_path / 'scored.jsonl', protocol_dir=tmp_path, fixed=_FIXED
  )
  assert info['forced'] and info['committed'] is False and len(info['sha256']) == 64


def test_a_scored_protocol_is_refused_then_forced_and_marked(tmp_path, monkeypatch):
  (tmp_path / 'p.yaml').write_text('protocol_name: p\n')
  monkeypatch.setattr(protocol, 'committed_unmodified', lambda path: True)
  ledger = tmp_path / 'scored.jsonl'
  info = protocol.check(_cfg(protocol_name='p'), ledger=ledger, protocol_dir=tmp_path, fixed=_FIXED)
  assert not info['forced'] and info['earlier_scorings'] == 0
  protocol.record(info, tmp_path / 'run', summary={'x': {'m': 0.5}}, paired={}, n_questions=3, ledger=ledger)
  with pytest.raises(ValueError, match='already scored'):
    protocol.check(_cfg(protocol_name='p'), ledger=ledger, protocol_dir=tmp_path, fixed=_FIXED)
  forced = protocol.check(
    _cfg(protocol_name='p', protocol_force=True), ledger=ledger, protocol_dir=tmp_path, fixed=_FIXED
  )
  assert forced['forced'] and forced['earlier_scorings'] == 1
  protocol.record(forced, tmp_path / 'run2', summary={}, paired={}, n_questions=3, ledger=ledger)
  rows = [json.loads(l) for l in ledger.read_text().splitlines()]
  assert [r['forced'] for r in rows] == [False, True]
  # a comment-only edit is the same protocol: still refused unforced (keyed on the name, not the file's hash)
  (tmp_path / 'p.yaml').write_text('protocol_name: p\n# edited\n')
  with pytest.raises(ValueError, match='protocol p was already scored.*also after an edit of its file'):
    protocol.check(_cfg(protocol_name='p'), ledger=ledger, protocol_dir=tmp_path, fixed=_FIXED)
  assert rows[0]['config_sha256'] == protocol.config_sha256(_cfg(protocol_name='p'))


def test_committed_protocols_parse_and_name_themselves():
  for path in protocol.PROTOCOL_DIR.glob('*.yaml'):
    node = OmegaConf.load(path)
    assert node.protocol_name == path.stem and node.fit.params and node.primary_metric


def _episodes(n):
  return [
    Episode(
      id=f'e{i}',
      items=(Item(f'i{i}', f'text {i}', 'p', 0),),
      questions=(Question(f'q{i}', f'question {i}', (f'i{i}',), ('p',), 'c'),),
    )
    for i in range(n)
  ]


def test_confirm_part_is_everything_outside_train_and_disjoint():
  load = lambda root: (_episodes(30), LoadReport('toy'))
  train, _ = splits.load_part(load=load, part='train', n_train=10, seed=3)
  confirm, report = splits.load_part(load=load, part='confirm', n_train=10, seed=3)
  t = {q.id for e in train for q in e.questions}
  c = {q.id for e in confirm for q in e.questions}
  assert len(t) == 10 and len(c) == 20 and not t & c
  assert report.to_dict()['counts']['questions_in_confirm'] == 20
  with pytest.raises(ValueError, match='Unknown part'):
    splits.load_part(load=load, part='nope')


def test_protocols_compose_with_the_fit_config_and_pass_its_checks():
  from hydra import compose, initialize_config_dir

  from experiments.lib import checks

  with initialize_config_dir(config_dir=str(protocol.ROOT / 'conf'), version_base='1.3'):
    lme = compose('fit', overrides=['+protocol=lme_session'])
    loc = compose('fit', overrides=['+protocol=locomo_full'])
  assert lme.protocol_name == 'lme_session' and lme.fit.split == 'parts'
  assert lme.dataset.loader.part == 'confirm' and lme.fit.train.loader.part == 'train'
  assert lme.dataset.loader.n_train == lme.fit.train.loader.n_train  # confirm = outside that very training split
  assert loc.protocol_name == 'locomo_full' and loc.fit.split == 'crossfit' and len(loc.fit.params) == 8
  for cfg in (lme, loc):
    checks.check_fit(cfg)


def test_overrides_that_change_fixed_settings_are_refused_then_forced_and_marked(tmp_path, monkeypatch):
  """A committed protocol run with `embedder=hashing fit.steps=2 fit.params=[k0]` was recorded as an unforced
  confirmation (only the file's hash was checked): now refused, naming the changed settings; forced, it is marked."""
  from hydra import compose, initialize_config_dir

  monkeypatch.setattr(protocol, 'committed_unmodified', lambda path: True)
  ledger = tmp_path / 'scored.jsonl'
  bad = ['embedder=hashing', 'fit.steps=2', 'fit.params=[k0]']
  with initialize_config_dir(config_dir=str(protocol.CONF), version_base='1.3'):
    own = compose('fit', overrides=['+protocol=locomo_full', 'eval.progress=false', f'protocol_ledger={ledger}'])
    changed = compose('fit', overrides=['+protocol=locomo_full', *bad, f'protocol_ledger={ledger}'])
    forced = compose(
      'fit', overrides=['+protocol=locomo_full', *bad, 'protocol_force=true', f'protocol_ledger={ledger}']
    )
  empty = tmp_path / 'committed.jsonl'  # locomo_full is scored in the real committed ledger
  info = protocol.check(own, committed_ledger=empty)  # progress bars and the ledger's path are not fixed settings
  assert info['changed_settings'] == [] and not info['forced'] and len(info['config_sha256']) == 64
  with pytest.raises(
    ValueError,
    match=r"protocol locomo_full: the run's overrides change settings the protocol "
    r'fixes \(embedder.*fit.params.*fit.steps',
  ) as e:
    protocol.check(changed, committed_ledger=empty)
  assert '\n' not in str(e.value)
  marked = protocol.check(forced, committed_ledger=empty)
  assert marked['forced'] and {'fit.steps', 'fit.params'} <= set(marked['changed_settings'])
  assert marked['config_sha256'] != info['config_sha256']
  protocol.record(marked, tmp_path / 'run', summary={}, paired={}, n_questions=1)
  row = json.loads(ledger.read_text())
  assert row['forced'] and row['changed_settings'] == marked['changed_settings']
  assert row['config_sha256'] == marked['config_sha256'] and row['forced_because']
  with pytest.raises(ValueError, match='protocol locomo_full was already scored'):  # by name, whatever was changed
    protocol.check(own, committed_ledger=empty)


def test_a_new_ledger_file_does_not_hide_the_committed_one(tmp_path, monkeypatch):
  """Probe (c1): `+protocol=locomo_full protocol_ledger=<new file>` passed unforced with earlier_scorings 0; the
  committed ledger is now always consulted, and a forced rerun says it was already scored."""
  from hydra import compose, initialize_config_dir

  monkeypatch.setattr(protocol, 'committed_unmodified', lambda path: True)
  new = tmp_path / 'new.jsonl'
  with initialize_config_dir(config_dir=str(protocol.CONF), version_base='1.3'):
    cfg = compose('fit', overrides=['+protocol=locomo_full', f'protocol_ledger={new}'])
    forced = compose('fit', overrides=['+protocol=locomo_full', f'protocol_ledger={new}', 'protocol_force=true'])
  with pytest.raises(ValueError, match=r'protocol locomo_full was already scored on 2026-12-01'):
    protocol.check(cfg)
  info = protocol.check(forced)
  assert info['forced'] and info['earlier_scorings'] >= 1 and info['forced_because'][0].startswith('already scored')
  assert info['ledger'] == str(new)  # the run appends to the scratch ledger only
  protocol.record(info, tmp_path / 'run', summary={}, paired={}, n_questions=1)
  row = json.loads(new.read_text())
  assert row['git_commit'] and row['packages']['numpy'] and row['forced_because'] == info['forced_because']


def _toy(text='a'):
  return [
    Episode(
      id='e0',
      items=(Item('i0', text, 'p', 0), Item('i1', 'b', 'p', 1)),
      questions=(Question('q0', 'q?', ('i0',), ('p',), 1),),
    )
  ]


def test_changed_data_is_refused_unless_forced_and_the_row_records_it(tmp_path):
  """Probe (c2): a confirmation on a modified data copy (paths are not fixed settings) ran unforced and recorded no
  fingerprint; now the data read is fingerprinted and compared with the pinned one."""
  cfg = OmegaConf.create({'dataset': {'name': 'toy', 'loader': {'x': 1}}, 'fit': {'split': 'crossfit'}})
  pins = tmp_path / 'data.json'
  key = protocol.data_key(cfg)
  pins.write_text(json.dumps({key: {'fingerprint': protocol.data_fingerprint(_toy()), 'n_episodes': 1}}))
  info = {'name': 'p', 'force': False, 'forced': False, 'forced_because': []}
  protocol.check_data(info, cfg, _toy(), pins)  # the pinned data: passes
  assert info['data']['fingerprint'] == info['data']['pinned'] and not info['forced']
  with pytest.raises(ValueError, match=r'protocol p: data changed: read 1 episodes with fingerprint'):
    protocol.check_data(dict(info), cfg, _toy('a '), pins)  # one trailing space
  other = OmegaConf.create({'dataset': {'name': 'toy', 'loader': {'x': 2}}, 'fit': {'split': 'crossfit'}})
  with pytest.raises(ValueError, match='no data fingerprint pinned for these dataset settings'):
    protocol.check_data(dict(info), other, _toy(), pins)
  forced = {'name': 'p', 'force': True, 'forced': False, 'forced_because': ['already scored 1x']}
  protocol.check_data(forced, cfg, _toy('a '), pins)
  assert forced['forced'] and forced['forced_because'][0] == 'already scored 1x'
  assert forced['forced_because'][1].startswith('data changed')
  assert protocol.data_key(OmegaConf.create({**OmegaConf.to_container(cfg), 'paths': {'data_root': '/x'}})) == key


def test_every_protocol_has_its_data_pinned():
  """conf/protocol/data.json holds a fingerprint for every protocol's dataset settings (written by `pin`)."""
  from hydra import compose, initialize_config_dir

  pins = json.loads(protocol.DATA_PINS.read_text())
  with initialize_config_dir(config_dir=str(protocol.CONF), version_base='1.3'):
    for path in sorted(protocol.PROTOCOL_DIR.glob('*.yaml')):
      cfg = compose('fit', overrides=[f'+protocol={path.stem}'])
      assert protocol.data_key(cfg) in pins, path.stem


def test_the_ledger_row_says_where_its_run_folder_is(tmp_path, caplog):
  """Inside the repository the row's run_dir is relative to it; outside (e.g. /tmp/...) it is absolute and the row
  says run_dir_outside_repo, and the run warns before its work."""
  (tmp_path / 'p.yaml').write_text('protocol_name: p\n')
  info = protocol.check(
    _cfg(protocol_name='p', protocol_force=True), ledger=tmp_path / 'l.jsonl', protocol_dir=tmp_path, fixed=_FIXED
  )
  inside = protocol.ROOT / 'outputs' / 'protocols' / 'p'
  for out in (inside, tmp_path / 'run'):
    protocol.record(info, out, summary={}, paired={}, n_questions=1, ledger=tmp_path / 'l.jsonl')
  rows = [json.loads(l) for l in (tmp_path / 'l.jsonl').read_text().splitlines()]
  assert rows[0]['run_dir'] == 'outputs/protocols/p' and 'run_dir_outside_repo' not in rows[0]
  assert rows[1]['run_dir'] == str((tmp_path / 'run').resolve()) and rows[1]['run_dir_outside_repo'] is True
  assert protocol.warn_run_dir(inside) is None
  with caplog.at_level('WARNING'):
    assert 'outside the repository' in protocol.warn_run_dir(tmp_path / 'run')
  assert 'run_dir_outside_repo' in caplog.text


def test_notes_annotate_ledger_rows_without_changing_them(tmp_path):
  """A note names its row by protocol and date; the committed notes all name a committed row; a note naming no row,
  or of an unknown kind, is refused."""
  ledger = protocol.read_jsonl(protocol.LEDGER)
  notes = protocol.read_jsonl(protocol.NOTES)
  rows = protocol.annotated(ledger, notes)
  assert [{k: v for k, v in r.items() if k != 'notes'} for r in rows] == ledger  # numbers untouched
  assert sum(len(r['notes']) for r in rows) == len(notes)
  row = {'protocol': 'p', 'date': 'd', 'summary': {}}
  with pytest.raises(ValueError, match='no such ledger row'):
    protocol.annotated([row], [{'protocol': 'p', 'row_date': 'x', 'kind': 'not_reproduced', 'date': 'd', 'note': 'n'}])
  with pytest.raises(ValueError, match='kind'):
    protocol.annotated([row], [{'protocol': 'p', 'row_date': 'd', 'kind': 'typo', 'date': 'd', 'note': 'n'}])
  (tmp_path / 'bad.jsonl').write_text('{"a": 1}\nnot json\n')
  with pytest.raises(ValueError, match='line 2 is not JSON'):
    protocol.read_jsonl(tmp_path / 'bad.jsonl')


def test_a_dirty_checkout_is_refused_unless_forced_naming_its_files(tmp_path, monkeypatch):
  """Issue 50, item 5: a protocol run from a checkout whose tracked files differ from HEAD was recorded as an unforced
  confirmation (its row's git_commit ``...+dirty`` names code that never existed); now refused in one line naming
  the first files, or, forced, marked as forced with the reason."""
  (tmp_path / 'p.yaml').write_text('protocol_name: p\n')
  monkeypatch.setattr(protocol, 'committed_unmodified', lambda path: True)
  dirty = ['conf/protocol/scored.jsonl', 'engram_jax/fit/a.py', 'engram_jax/fit/b.py', 'experiments/fit.py']
  monkeypatch.setattr(protocol, 'dirty_files', lambda: dirty)
  ledger = tmp_path / 'scored.jsonl'
  with pytest.raises(EngramError, match='protocol p: dirty checkout: 4 tracked files differ from HEAD') as e:
    protocol.check(_cfg(protocol_name='p'), ledger=ledger, protocol_dir=tmp_path, fixed=_FIXED)
  assert '(conf/protocol/scored.jsonl, engram_jax/fit/a.py, engram_jax/fit/b.py, ...)' in str(e.value)
  assert '\n' not in str(e.value) and 'protocol_force=true' in str(e.value)
  forced = protocol.check(
    _cfg(protocol_name='p', protocol_force=True), ledger=ledger, protocol_dir=tmp_path, fixed=_FIXED
  )
  assert forced['forced'] and forced['forced_because'] == [protocol.dirty_reason(dirty)]
  assert forced['dirty_files'] == dirty
  assert protocol.markdown_lines(forced)[1].startswith('Protocol p: **forced** (dirty checkout: 4 tracked files')
  protocol.record(forced, tmp_path / 'run', summary={}, paired={}, n_questions=1)
  row = json.loads(ledger.read_text())
  assert row['forced'] and row['forced_because'][0].startswith('dirty checkout')


def _git(repo, *args):
  cmd = ['git', '-c', 'user.name=t', '-c', 'user.email=t@t', '-c', 'commit.gpgsign=false', *args]
  subprocess.run(cmd, cwd=repo, check=True, capture_output=True)


def test_an_earlier_runs_uncommitted_ledger_row_makes_the_checkout_dirty(tmp_path, monkeypatch):
  """In a real git checkout: the ledger an earlier run appended to is a tracked file that differs from HEAD, so the
  next confirmation is refused until that row is committed; untracked files (run folders, scratch ledgers) are not."""
  repo = tmp_path / 'repo'
  (repo / 'conf' / 'protocol').mkdir(parents=True)
  (repo / 'conf' / 'protocol' / 'scored.jsonl').write_text('')
  (repo / 'code.py').write_text('x = 1\n')
  _git(repo, 'init', '-q')
  _git(repo, 'add', '.')
  _git(repo, 'commit', '-qm', 'protocol')
  assert REAL_DIRTY_FILES(repo) == []
  (repo / 'outputs').mkdir()
  (repo / 'outputs' / 'results.json').write_text('{}')  # untracked: not dirty
  assert REAL_DIRTY_FILES(repo) == []
  (repo / 'conf' / 'protocol' / 'scored.jsonl').write_text('{"protocol": "q"}\n')  # an earlier run's row
  assert REAL_DIRTY_FILES(repo) == ['conf/protocol/scored.jsonl']
  (repo / 'code.py').unlink()
  assert REAL_DIRTY_FILES(repo) == ['code.py', 'conf/protocol/scored.jsonl']
  (tmp_path / 'p.yaml').write_text('protocol_name: p\n')
  monkeypatch.setattr(protocol, 'committed_unmodified', lambda path: True)
  monkeypatch.setattr(protocol, 'dirty_files', lambda: REAL_DIRTY_FILES(repo))
  args = {'ledger': tmp_path / 'l.jsonl', 'protocol_dir': tmp_path, 'fixed': _FIXED}
  with pytest.raises(EngramError, match=r'2 tracked files differ from HEAD \(code.py, conf/protocol/scored.jsonl\)'):
    protocol.check(_cfg(protocol_name='p'), **args)
  _git(repo, 'commit', '-qam', 'the ledger row, with its results')
  info = protocol.check(_cfg(protocol_name='p'), **args)
  assert not info['forced'] and info['dirty_files'] == []
  (tmp_path / 'plain').mkdir()
  assert REAL_DIRTY_FILES(tmp_path / 'plain') is None  # not a git checkout: nothing to refuse
