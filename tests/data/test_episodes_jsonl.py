"""The episodes file (engram_jax.data.episodes_jsonl): written and read back equal, counted normalisations, one-line
errors naming file, line and id for bad files, and (on the real data) every bundled benchmark exported and read back
to the same episodes and report; the slow test scores an export byte-identically to the bundled loader's run."""

from __future__ import annotations

import gzip
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from engram_jax.core.errors import DataNotFoundError, EngramError
from engram_jax.core.types import Episode, Item, LoadReport, Question
from engram_jax.data import io
from engram_jax.data.episodes_jsonl import FORMAT, episode_records, load_episodes_jsonl, write_episodes_jsonl

ROOT = Path(__file__).resolve().parents[2]
try:
  DATA = io.resolve_data_root()
except FileNotFoundError:
  DATA = None


def _have(*parts):
  return DATA is not None and (DATA.joinpath(*parts)).is_file()


needs_locomo = pytest.mark.skipif(not _have('locomo', 'locomo10.json'), reason='LoCoMo not under the data root')


def _episodes() -> list[Episode]:
  items = (
    Item('m1', 'I adopted a dog.', 's1', 0, time='2024-01-02', speaker='me'),
    Item('m2', 'The dog is called Rex.', 's1', 1, speaker='me'),
    Item('m3', '', 's2', 2),  # blank text is kept as it is
  )
  qs = (
    Question('q1', "What is my dog's name?", ('m2', 'm1'), ('s1',), 4, answer='Rex', time='2024-02-01'),
    Question('q2', 'Anything?', ('m3',), ('s2', 'other'), 'open', answer=None),  # gold_parents not derived
  )
  other = Episode('e2', (Item('x', 'x text', 'p', 0),), (Question('q3', 'x?', ('x',), ('p',), 0),))
  return [Episode('e1', items, qs), other]


def _lines(path: Path, records: list) -> Path:
  path.write_text(''.join((r if isinstance(r, str) else json.dumps(r)) + '\n' for r in records))
  return path


EP = {'type': 'episode', 'id': 'e1'}
IT = {'type': 'item', 'id': 'm1', 'text': 'a dog', 'parent': 's1'}
Q = {'type': 'question', 'id': 'q1', 'text': 'which dog?', 'gold': ['m1']}


def _refused(path: Path, line: int, *needles: str) -> str:
  with pytest.raises(EngramError) as e:
    load_episodes_jsonl(path=path)
  msg = str(e.value)
  assert '\n' not in msg, msg
  assert msg.startswith(f'{path}:{line}: '), msg
  for n in needles:
    assert n in msg, (n, msg)
  return msg


# ------------------------------------------------------------------------------------------------ round trip


@pytest.mark.parametrize('suffix', ['.jsonl', '.jsonl.gz'])
def test_written_and_read_back_equal(tmp_path, suffix):
  eps = _episodes()
  path = write_episodes_jsonl(tmp_path / f'mine{suffix}', eps, name='mine')
  got, report = load_episodes_jsonl(path=path)
  assert got == eps
  assert report.dataset == 'mine' and report.source == str(path)
  assert dict(report.counts) == {'episodes': 2, 'items': 4, 'questions_read': 3, 'questions_kept': 3}
  assert not report.examples
  raw = gzip.open(path, 'rt').read() if suffix.endswith('.gz') else path.read_text()
  first, *rest = [json.loads(line) for line in raw.splitlines()]
  assert first == {'type': 'dataset', 'format': FORMAT, 'name': 'mine'}
  q1 = next(r for r in rest if r.get('id') == 'q1')
  assert 'gold_parents' not in q1  # the parents of its gold items: the reader's default
  assert next(r for r in rest if r.get('id') == 'q2')['gold_parents'] == ['s2', 'other']


def test_gzip_output_is_deterministic(tmp_path):
  a = write_episodes_jsonl(tmp_path / 'a.jsonl.gz', _episodes()).read_bytes()
  b = write_episodes_jsonl(tmp_path / 'b.jsonl.gz', _episodes()).read_bytes()
  assert a == b


def test_a_carried_report_is_continued_as_written(tmp_path):
  rep = LoadReport('locomo')
  rep.add('split_multi_id', ('conv-26/q37', 'D8:6; D9:17'))
  rep.add('items', n=4)
  rep.source = 'locomo/locomo10.json'
  path = write_episodes_jsonl(tmp_path / 'x.jsonl', _episodes(), name='locomo', load_report=rep)
  _, got = load_episodes_jsonl(path=path)
  assert json.dumps(got.to_dict()) == json.dumps(rep.to_dict())  # byte for byte: a run's results.json is unchanged
  # what the reader itself changes is added after the carried counts
  text = path.read_text().replace('"gold": ["m2", "m1"]', '"gold": ["m2", "m1", "m2"]')
  _, got = load_episodes_jsonl(path=_lines(tmp_path / 'y.jsonl', text.splitlines()))
  assert list(got.counts) == ['split_multi_id', 'items', 'dropped_duplicate_gold_id']
  assert got.examples['dropped_duplicate_gold_id'] == [('q1', 'm2')]


def test_normalisations_are_counted(tmp_path):
  path = _lines(
    tmp_path / 'n.jsonl',
    [
      EP,
      IT,
      {**IT, 'id': 'm2'},
      '',
      {**Q, 'gold': ['m1', 'm1'], 'answer': 2022},
      {**Q, 'id': 'q2', 'gold': []},
      {'type': 'episode', 'id': 'e2'},
      {**IT, 'id': 'z'},
    ],
  )
  (ep,), report = load_episodes_jsonl(path=path)
  c = report.counts
  assert c['dropped_duplicate_gold_id'] == 1 and c['answer_number_stringified'] == 1 and c['excluded_no_gold'] == 1
  assert c['episodes_without_questions'] == 1 and c['blank_lines_skipped'] == 1
  assert c['questions_read'] == 2 and c['questions_kept'] == 1 and c['episodes'] == 2 and c['items'] == 3
  q = ep.questions[0]
  assert q.gold == ('m1',) and q.answer == '2022' and q.gold_parents == ('s1',) and q.category == 0
  assert [it.position for it in ep.items] == [0, 1]


def test_conversations_select_episodes_and_unknown_ones_are_refused(tmp_path):
  path = write_episodes_jsonl(tmp_path / 'x.jsonl', _episodes())
  eps, _ = load_episodes_jsonl(path=path, conversations=['e2'])
  assert [e.id for e in eps] == ['e2']
  with pytest.raises(EngramError, match=r"unknown episodes \['nope'\]"):
    load_episodes_jsonl(path=path, conversations=['nope'])


def test_path_under_the_data_root_and_a_missing_file(tmp_path, monkeypatch):
  write_episodes_jsonl(tmp_path / 'mine' / 'x.jsonl', _episodes())
  monkeypatch.chdir(ROOT)
  eps, _ = load_episodes_jsonl(str(tmp_path), path='mine/x.jsonl')
  assert len(eps) == 2
  with pytest.raises(DataNotFoundError, match='nowhere.jsonl not found'):
    load_episodes_jsonl(str(tmp_path), path='nowhere.jsonl')
  with pytest.raises(EngramError, match='dataset.loader.path'):
    load_episodes_jsonl(str(tmp_path))


# ------------------------------------------------------------------------------------------------ bad files


@pytest.mark.parametrize(
  'records, line, needles',
  [
    ([EP, IT, '{"type": "question", "id": "q1", "text": "x",'], 3, ['malformed JSON at column']),
    ([EP, IT, '[1, 2]'], 3, ['must be a JSON object, got list']),
    ([EP, {**IT, 'type': 'memory'}], 2, ["type 'memory' is not a record type"]),
    ([EP, {'type': 'item', 'id': 'm1', 'text': 'a'}], 2, ["item 'm1' lacks field 'parent'"]),
    ([EP, IT, {'type': 'question', 'id': 'q1', 'text': 'x?'}], 3, ["question 'q1' lacks field 'gold'"]),
    ([EP, {**IT, 'golds': 1}], 2, ["item 'm1' has unknown field 'golds'"]),
    ([EP, IT, {**IT, 'text': 'again'}], 3, ["item 'm1' of episode 'e1'", 'repeated item id', 'first on line 2']),
    ([EP, IT, Q, EP, IT, Q], 4, ["episode 'e1'", 'repeated episode id', 'first on line 1']),
    ([EP, IT, Q, {**EP, 'id': 'e2'}, IT, Q], 6, ["question 'q1'", 'repeated question id', 'first on line 3']),
    ([EP, IT, {**Q, 'gold': ['m9']}], 3, ["question 'q1' of episode 'e1'", "gold id 'm9' is no item"]),
    ([EP, IT, {**Q, 'gold': 'm1'}], 3, ["question 'q1'", 'expected a list of non-blank id strings']),
    ([EP, IT, {**Q, 'category': True}], 3, ["question 'q1'", 'category is bool']),
    ([EP, IT, {**Q, 'answer': ['a']}], 3, ["question 'q1'", 'answer is list']),
    ([EP, {**IT, 'text': 5}], 2, ["item 'm1'", 'text is int']),
    ([EP, {**IT, 'parent': ' '}], 2, ["item 'm1'", 'parent is str']),
    ([EP, {**IT, 'time': 20240101}], 2, ["item 'm1'", 'time is int']),
    ([IT], 1, ["item 'm1' comes before any episode record"]),
    ([EP, IT, Q, {**IT, 'id': 'm2'}], 4, ["item 'm2' of episode 'e1' comes after a question"]),
    ([EP, {'type': 'dataset'}], 2, ['a dataset record must be the first line']),
    ([{'type': 'dataset', 'format': 'engram_jax.episodes/9'}, EP, IT], 1, ["format 'engram_jax.episodes/9'"]),
    ([EP, IT, Q, {**EP, 'id': 'e2'}], 4, ["episode 'e2' has no items"]),
    ([{**EP, 'id': ''}], 1, ['episode: id is str']),
    ([{'type': 'dataset', 'name': 'x'}], 1, ['no episode record']),
  ],
)
def test_a_bad_file_is_one_line_naming_file_line_and_id(tmp_path, records, line, needles):
  _refused(_lines(tmp_path / 'bad.jsonl', records), line, *needles)


def test_an_empty_file_is_one_line(tmp_path):
  for text in ('', '\n\n'):
    path = tmp_path / 'empty.jsonl'
    path.write_text(text)
    _refused(path, max(1, text.count('\n')), 'no records (an empty file)')


def test_a_damaged_gzip_is_one_line(tmp_path):
  path = write_episodes_jsonl(tmp_path / 'x.jsonl.gz', _episodes())
  path.write_bytes(path.read_bytes()[:40])
  with pytest.raises(EngramError, match=r'x.jsonl.gz: cannot read'):
    load_episodes_jsonl(path=path)


def test_records_are_the_documented_fields():
  recs = list(episode_records(_episodes(), name='n'))
  kinds = ['dataset', 'episode', 'item', 'item', 'item', 'question', 'question', 'episode', 'item', 'question']
  assert [r['type'] for r in recs] == kinds
  assert recs[2] == {
    'type': 'item',
    'id': 'm1',
    'text': 'I adopted a dog.',
    'parent': 's1',
    'time': '2024-01-02',
    'speaker': 'me',
  }


# ------------------------------------------------------------------------------------------------ real data


def _round_trip(tmp_path, episodes, report, name):
  path = write_episodes_jsonl(tmp_path / f'{name}.jsonl', episodes, name=name, load_report=report)
  got, rep = load_episodes_jsonl(path=path)
  assert got == episodes
  assert json.dumps(rep.to_dict()) == json.dumps(report.to_dict())
  return path


@needs_locomo
def test_locomo_exported_and_read_back_equal(tmp_path):
  from engram_jax.data import locomo

  eps, report = locomo.load_locomo(conversations=['conv-26', 'conv-30'])
  _round_trip(tmp_path, eps, report, 'locomo')


@pytest.mark.slow
@pytest.mark.skipif(
  not (_have('locomo', 'locomo10.json') and _have('memoryagentbench', 'factconsolidation_official_6k.json')),
  reason='LoCoMo or FactConsolidation not under the data root',
)
def test_every_bundled_benchmark_exported_and_read_back_equal(tmp_path):
  from engram_jax.data import factconsolidation, locomo, longmemeval, splits

  loaders = {
    'locomo': lambda: locomo.load_locomo(),
    'fc_sh_6k': lambda: factconsolidation.load_factconsolidation(size='6k', hop='sh'),
    'longmemeval_s': lambda: splits.load_part(
      load=lambda root: longmemeval.load_longmemeval(root, split='s', level='session'),
      part='pilot',
      pilot='longmemeval_s',
      official_skips=True,
    ),
  }
  for name, load in loaders.items():
    eps, report = load()
    _round_trip(tmp_path, eps, report, name)  # every field of every item and question (frozen dataclasses' ==)


@pytest.mark.slow
@needs_locomo
def test_an_exported_conversation_scores_byte_identically(tmp_path):
  """(a) on one conversation: `experiments.export_episodes` then `experiments.evaluate` on the file with the command
  it prints gives the bundled loader's results.json, byte for byte (cmp)."""
  common = ['embedder=hashing', 'eval.progress=false', 'eval.n_resamples=200']
  sel = 'dataset.loader.conversations=[conv-26]'
  out = tmp_path / 'conv26.jsonl'

  def cli(module, *args):
    proc = subprocess.run(
      [sys.executable, '-m', module, *args], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout

  printed = cli('experiments.export_episodes', 'dataset=locomo', sel, f'out={out}', f'hydra.run.dir={tmp_path / "x"}')
  command = shlex.split(printed.strip().splitlines()[-1])
  assert command[:3] == ['python', '-m', 'experiments.evaluate'] and 'dataset.name=locomo' in command
  cli('experiments.evaluate', sel, *common, f'hydra.run.dir={tmp_path / "bundled"}')
  cli(*command[2:], *common, f'hydra.run.dir={tmp_path / "episodes"}')
  a, b = (tmp_path / 'bundled' / 'results.json').read_bytes(), (tmp_path / 'episodes' / 'results.json').read_bytes()
  assert a == b
