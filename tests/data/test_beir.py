"""A BEIR folder (engram_jax.data.beir) made in tmp_path: read as one episode in corpus file order, every
normalisation counted, bad files refused in one line naming file and line; the slow test evaluates it end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engram_jax.core.errors import DataNotFoundError, EngramError
from engram_jax.data.beir import load_beir

DOCS = [
  {'_id': 'd1', 'title': 'Dogs', 'text': 'Rex is a brown dog who likes the park.'},
  {'_id': 'd2', 'title': '', 'text': 'The invoice for March is overdue.'},
  {'_id': 'd3', 'text': 'Alps hiking trip planned for July.', 'metadata': {'url': 'x'}},
  {'_id': 'd4', 'title': 'Cats', 'text': 'Tom the cat sleeps all day.'},
] + [{'_id': f'f{i}', 'title': '', 'text': f'filler document number {i} about nothing'} for i in range(10)]
QUERIES = [
  {'_id': 'q1', 'text': 'Which dog likes the park?'},
  {'_id': 'q2', 'text': 'What is overdue?'},
  {'_id': 'q3', 'text': 'Where is the hiking trip?'},
  {'_id': 'q4', 'text': 'A query judged only in train'},
  {'_id': 'q5', 'text': 'A query judged not relevant'},
]
QRELS = [('q1', 'd1', 1), ('q2', 'd2', 2), ('q2', 'd4', 0), ('q3', 'd3', 1), ('q3', 'gone', 1), ('qx', 'd1', 1)]
QRELS += [('q5', 'd4', 0), ('q1', 'd1', 1)]


def make_beir(folder: Path, docs=DOCS, queries=QUERIES, qrels=QRELS, header='query-id\tcorpus-id\tscore') -> Path:
  (folder / 'qrels').mkdir(parents=True, exist_ok=True)
  (folder / 'corpus.jsonl').write_text(''.join((d if isinstance(d, str) else json.dumps(d)) + '\n' for d in docs))
  (folder / 'queries.jsonl').write_text(''.join((q if isinstance(q, str) else json.dumps(q)) + '\n' for q in queries))
  rows = [header] + ['\t'.join(map(str, r)) if not isinstance(r, str) else r for r in qrels]
  (folder / 'qrels' / 'test.tsv').write_text('\n'.join(rows) + '\n')
  (folder / 'qrels' / 'train.tsv').write_text(f'{header}\nq4\td2\t1\n')
  return folder


def test_a_beir_folder_is_one_episode_in_file_order(tmp_path, capsys):
  (ep,), report = load_beir(path=make_beir(tmp_path / 'tiny'), split='test')
  assert ep.id == 'tiny'
  assert [it.id for it in ep.items] == [d['_id'] for d in DOCS] and [it.position for it in ep.items] == list(range(14))
  assert ep.items[0].text == 'Dogs Rex is a brown dog who likes the park.'
  assert ep.items[1].text == 'The invoice for March is overdue.' and ep.items[1].parent == 'd2'
  assert [(q.id, q.gold) for q in ep.questions] == [('q1', ('d1',)), ('q2', ('d2',)), ('q3', ('d3',))]
  c = report.counts
  assert report.dataset == 'beir/tiny/test' and report.source == str(tmp_path / 'tiny')
  assert c['items'] == 14 and c['write_order_is_corpus_file_order'] == 14 and c['items_with_title'] == 2
  assert c['queries_read'] == 5 and c['qrels_read'] == 8 and c['questions_kept'] == 3
  assert c['graded_relevance_binarised'] == 1 and c['qrels_score_not_positive'] == 2
  assert c['qrels_unknown_corpus_id'] == 1 and c['qrels_unknown_query_id'] == 1 and c['qrels_duplicate_pair'] == 1
  assert c['queries_not_in_split'] == 1 and c['queries_without_relevant'] == 1
  assert report.examples['queries_not_in_split'] == ['q4']
  with capsys.disabled():
    print('\n' + report.summary())
  (train,), _ = load_beir(path=tmp_path / 'tiny', split='train')
  assert [(q.id, q.gold) for q in train.questions] == [('q4', ('d2',))]


def _refused(folder: Path, split: str, where: str, *needles: str) -> None:
  with pytest.raises(EngramError) as e:
    load_beir(path=folder, split=split)
  msg = str(e.value)
  assert '\n' not in msg and msg.startswith(str(folder / where)), msg
  for n in needles:
    assert n in msg, (n, msg)


@pytest.mark.parametrize(
  'change, where, needles',
  [
    ({'docs': DOCS[:2] + ['{"_id": "d3", "text": '] + DOCS[3:]}, 'corpus.jsonl:3', ['malformed JSON']),
    ({'docs': DOCS + [DOCS[0]]}, 'corpus.jsonl:15', ["document 'd1': repeated id (first on line 1)"]),
    ({'docs': [{'title': 't', 'text': 'x'}]}, 'corpus.jsonl:1', ["lacks field '_id'"]),
    ({'docs': [{'_id': 'd1', 'title': 't'}]}, 'corpus.jsonl:1', ["'d1': lacks field 'text'"]),
    ({'docs': [{'_id': 'd1', 'title': 3, 'text': 'x'}]}, 'corpus.jsonl:1', ["'d1': title is int"]),
    ({'docs': []}, 'corpus.jsonl:1', ['no documents']),
    ({'queries': QUERIES + [QUERIES[1]]}, 'queries.jsonl:6', ["query 'q2': repeated id (first on line 2)"]),
    ({'queries': [{'_id': 'q1', 'text': ' '}]}, 'queries.jsonl:1', ["'q1': text is blank"]),
    ({'queries': ['[1]']}, 'queries.jsonl:1', ['must be a JSON object']),
    ({'header': 'qid\tdocid\trel'}, 'qrels/test.tsv:1', ['expected the header']),
    ({'qrels': ['q1\td1']}, 'qrels/test.tsv:2', ['expected 3 tab-separated fields']),
    ({'qrels': ['q1\td1\thigh']}, 'qrels/test.tsv:2', ["score 'high' is not an integer"]),
    ({'qrels': [('q1', 'd1', 0)]}, 'qrels/test.tsv', ['no query of this split has a relevant document']),
  ],
)
def test_a_bad_beir_folder_is_one_line_naming_file_and_line(tmp_path, change, where, needles):
  _refused(make_beir(tmp_path / 'bad', **change), 'test', where, *needles)


def test_a_missing_split_or_folder_says_what_is_there(tmp_path):
  folder = make_beir(tmp_path / 'tiny')
  with pytest.raises(DataNotFoundError, match=r"dev.tsv not found \(splits in that folder: \['test', 'train'\]\)"):
    load_beir(path=folder, split='dev')
  with pytest.raises(DataNotFoundError, match='not found'):
    load_beir(path=tmp_path / 'nowhere')
  (tmp_path / 'file').write_text('x')
  with pytest.raises(EngramError, match='a BEIR dataset is a folder'):
    load_beir(path=tmp_path / 'file')


@pytest.mark.slow
def test_a_beir_folder_evaluates_end_to_end(tmp_path):
  """`dataset=beir` through experiments.evaluate: every query scored, its TREC run and qrels written."""
  from hydra import compose, initialize_config_dir

  from experiments import evaluate

  folder = make_beir(tmp_path / 'tiny')
  conf = str(Path(__file__).resolve().parents[2] / 'conf')
  with initialize_config_dir(config_dir=conf, version_base='1.3'):
    cfg = compose(
      config_name='config',
      overrides=[
        'dataset=beir',
        f'dataset.loader.path={folder}',
        'embedder=hashing',
        f'paths.cache_dir={tmp_path / "cache"}',
        'paths.compile_cache_dir=null',
        'eval.progress=false',
        'eval.n_resamples=200',
      ],
    )
  res = evaluate.run(cfg, tmp_path / 'run')
  assert res['dataset'] == 'beir' and res['n_questions'] == 3
  assert res['load_report']['counts']['write_order_is_corpus_file_order'] == 14
  assert (tmp_path / 'run' / 'qrels' / 'beir.qrels').read_text() == 'q1 0 d1 1\nq2 0 d2 1\nq3 0 d3 1\n'
  assert len((tmp_path / 'run' / 'runs' / 'beir' / 'bm25.trec').read_text().splitlines()) == 30
