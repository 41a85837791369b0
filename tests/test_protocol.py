"""Protocols fixed in advance: committed before the run, scored once (refused again unless forced), recorded."""

import json

import pytest
from omegaconf import OmegaConf

from engram_jax.data import splits
from engram_jax.types import Episode, Item, LoadReport, Question
from experiments.lib import protocol


def _cfg(**kw):
  return OmegaConf.create({'protocol_name': None, 'protocol_force': False, **kw})


def test_no_protocol_and_unknown_protocol(tmp_path):
  assert protocol.check(_cfg()) is None
  with pytest.raises(ValueError, match="Unknown protocol 'nope'"):
    protocol.check(_cfg(protocol_name='nope'), protocol_dir=tmp_path)


def test_uncommitted_protocol_is_refused_unless_forced(tmp_path):
  (tmp_path / 'p.yaml').write_text('protocol_name: p\n')
  with pytest.raises(ValueError, match='not committed'):
    protocol.check(_cfg(protocol_name='p'), ledger=tmp_path / 'scored.jsonl', protocol_dir=tmp_path)
  info = protocol.check(_cfg(protocol_name='p', protocol_force=True), ledger=tmp_path / 'scored.jsonl',
                        protocol_dir=tmp_path)
  assert info['forced'] and info['committed'] is False and len(info['sha256']) == 64


def test_a_scored_protocol_is_refused_then_forced_and_marked(tmp_path, monkeypatch):
  (tmp_path / 'p.yaml').write_text('protocol_name: p\n')
  monkeypatch.setattr(protocol, 'committed_unmodified', lambda path: True)
  ledger = tmp_path / 'scored.jsonl'
  info = protocol.check(_cfg(protocol_name='p'), ledger=ledger, protocol_dir=tmp_path)
  assert not info['forced'] and info['earlier_scorings'] == 0
  protocol.record(info, tmp_path / 'run', summary={'x': {'m': 0.5}}, paired={}, n_questions=3, ledger=ledger)
  with pytest.raises(ValueError, match='already scored'):
    protocol.check(_cfg(protocol_name='p'), ledger=ledger, protocol_dir=tmp_path)
  forced = protocol.check(_cfg(protocol_name='p', protocol_force=True), ledger=ledger, protocol_dir=tmp_path)
  assert forced['forced'] and forced['earlier_scorings'] == 1
  protocol.record(forced, tmp_path / 'run2', summary={}, paired={}, n_questions=3, ledger=ledger)
  rows = [json.loads(l) for l in ledger.read_text().splitlines()]
  assert [r['forced'] for r in rows] == [False, True]
  # an edited protocol is a new protocol: its hash has no scoring yet
  (tmp_path / 'p.yaml').write_text('protocol_name: p\n# edited\n')
  assert protocol.check(_cfg(protocol_name='p'), ledger=ledger, protocol_dir=tmp_path)['earlier_scorings'] == 0


def test_committed_protocols_parse_and_name_themselves():
  for path in protocol.PROTOCOL_DIR.glob('*.yaml'):
    node = OmegaConf.load(path)
    assert node.protocol_name == path.stem and node.fit.params and node.primary_metric


def _episodes(n):
  return [Episode(id=f'e{i}', items=(Item(f'i{i}', f'text {i}', 'p', 0),),
                  questions=(Question(f'q{i}', f'question {i}', (f'i{i}',), ('p',), 'c'),)) for i in range(n)]


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
  from hydra import compose, initialize_config_dir  # pylint: disable=import-outside-toplevel
  from experiments.lib import checks  # pylint: disable=import-outside-toplevel
  with initialize_config_dir(config_dir=str(protocol.ROOT / 'conf'), version_base='1.3'):
    lme = compose('fit', overrides=['+protocol=lme_session'])
    loc = compose('fit', overrides=['+protocol=locomo_full'])
  assert lme.protocol_name == 'lme_session' and lme.fit.split == 'parts'
  assert lme.dataset.loader.part == 'confirm' and lme.fit.train.loader.part == 'train'
  assert lme.dataset.loader.n_train == lme.fit.train.loader.n_train  # confirm = outside that very training split
  assert loc.protocol_name == 'locomo_full' and loc.fit.split == 'crossfit' and len(loc.fit.params) == 8
  for cfg in (lme, loc):
    checks.check_fit(cfg)
