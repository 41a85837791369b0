"""trec_run: an external TREC run as a leg (engram_jax.ops.trec_run), on tiny run files written here."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from engram_jax import Episode, Item, Question, evaluate, make_pipeline
from engram_jax.core.batch import episode_arrays, stack_arrays
from engram_jax.core.errors import EngramError
from engram_jax.eval.pipeline import build_options, pipeline_topk
from engram_jax.ops import trec_run
from engram_jax.testing import check_operator


def _episode(name='e', n=6, questions=('q1', 'q2')):
  items = tuple(Item(f'd{j}', f'text {j}', 'S1', j) for j in range(n))
  qs = tuple(Question(q, f'{q}?', ('d0',), ('S1',), 1) for q in questions)
  return Episode(name, items, qs)


def _arrays(ep, pipe):
  rng = np.random.default_rng(0)
  docs = rng.normal(size=(ep.n_items, 4)).astype(np.float32)
  queries = rng.normal(size=(len(ep.questions), 4)).astype(np.float32)
  docs /= np.linalg.norm(docs, axis=-1, keepdims=True)
  queries /= np.linalg.norm(queries, axis=-1, keepdims=True)
  return episode_arrays(ep, docs, queries, n_multiple=8, q_multiple=4, **build_options([pipe])), (docs, queries)


def _write(tmp_path, text, name='ext.trec'):
  path = tmp_path / name
  path.write_text(text)
  return str(path)


def test_leg_reproduces_the_runs_order(tmp_path):
  # q1: scores out of file order, a tie (d1, d4 at 2.0) broken by the rank column; q2: three items
  path = _write(
    tmp_path,
    'q1 Q0 d3 1 5.0 x\nq1 Q0 d5 4 1.0 x\nq1 Q0 d4 3 2.0 x\nq1 Q0 d1 2 2.0 x\nq2 Q0 d2 1 0.5 x\nq2 Q0 d0 2 0.4 x\n',
  )
  ep = _episode()
  pipe = make_pipeline(legs={'ext': {'op': 'trec_run', 'path': path}}, name='ext')
  arr, _ = _arrays(ep, pipe)
  s = np.asarray(pipe.legs[0].score(arr, jax.random.key(0)))
  assert s.shape == np.asarray(arr.labels).shape
  assert np.argsort(-s[0])[:4].tolist() == [3, 1, 4, 5]
  assert np.isneginf(s[0, [0, 2]]).all() and np.isneginf(s[:, 6:]).all()  # not ranked; padding items
  top = np.asarray(pipeline_topk(pipe, arr, jax.random.key(0), k=2))
  assert top[0].tolist() == [3, 1] and top[1].tolist() == [2, 0]
  # stacked with a bigger episode: the same scores
  big, _ = _arrays(_episode('f', n=11), pipe)
  st = stack_arrays([arr, big])
  assert np.array_equal(np.asarray(st.leg_inputs[trec_run.input_name(path, 'skip')])[0, :2, :6], s[:2, :6])


def test_fused_with_cosine_by_rrf(tmp_path):
  path = _write(tmp_path, 'q1 Q0 d5 1 3 x\nq1 Q0 d4 2 2 x\nq2 Q0 d5 1 3 x\nq2 Q0 d4 2 2 x\n')
  ep = _episode()
  pipe = make_pipeline(
    legs={'cos': {'op': 'cosine'}, 'ext': {'op': 'trec_run', 'path': path, 'weight': 100.0}}, fusion='rrf'
  )
  arr, emb = _arrays(ep, pipe)
  top = np.asarray(pipeline_topk(pipe, arr, jax.random.key(0), k=3))
  assert top[0, :2].tolist() == [5, 4]  # the heavy external leg leads; cosine fills the rest
  res = evaluate([ep], [emb], {'f': pipe}, k=3, metrics=['recall@3'], seed=0, progress=False)
  assert res.retrieved['f'][0][:2] == ['d5', 'd4']


def test_unknown_ids_and_missing_questions_counted(tmp_path):
  path = _write(tmp_path, 'q1 Q0 d1 1 3 x\nq1 Q0 nope 2 2 x\nq1 Q0 also%20not 3 1 x\nother Q0 d1 1 1 x\n')
  ep = _episode()
  pipe = make_pipeline(legs={'ext': {'op': 'trec_run', 'path': path}}, name='ext')
  arr, _ = _arrays(ep, pipe)
  s = np.asarray(pipe.legs[0].score(arr, jax.random.key(0)))
  assert np.isfinite(s[0]).sum() == 1 and np.isneginf(s[1]).all()  # q2 missing: scored by no item (counted skip)
  report = trec_run.reports()[str(tmp_path / 'ext.trec')]
  assert report['questions'] == 2 and report['questions_missing'] == 1 and report['first_missing'] == ['q2']
  assert report['unknown_docids'] == 2 and report['first_unknown'] == ['also%20not', 'nope']
  assert report['run_qids_unmatched'] == 1 and report['items_ranked'] == 1


def test_missing_question_error(tmp_path):
  path = _write(tmp_path, 'q1 Q0 d1 1 3 x\n')
  pipe = make_pipeline(legs={'ext': {'op': 'trec_run', 'path': path, 'missing': 'error'}}, name='ext')
  with pytest.raises(
    EngramError, match=r'ext\.trec: the run has no lines for 1 of 2 questions of episode e \(first: q2\)'
  ):
    _arrays(_episode(), pipe)


def test_episode_prefixed_qids_match(tmp_path):
  path = _write(tmp_path, 'e/q1 Q0 d2 1 3 x\ne/q2 Q0 d3 1 3 x\n')
  pipe = make_pipeline(legs={'ext': {'op': 'trec_run', 'path': path}}, name='ext')
  arr, _ = _arrays(_episode(), pipe)
  s = np.asarray(pipe.legs[0].score(arr, jax.random.key(0)))
  assert s[0].argmax() == 2 and s[1].argmax() == 3


@pytest.mark.parametrize(
  'text, message',
  [
    ('q1 Q0 d1 1 3 x\nq1 Q0 d2 2 x\n', r'ext\.trec:2: a TREC run line has 6 fields .* got 5'),
    ('q1 Q0 d1 one 3 x\n', r'ext\.trec:1: rank .one. is not an integer \(qid q1, docid d1\)'),
    ('q1 Q0 d1 1 nan x\n', r'ext\.trec:1: score .nan. is not a finite number'),
    ('q1 Q0 d1 1 3 x\n\nq1 Q0 d1 2 2 x\n', r'ext\.trec:3: docid d1 appears twice for qid q1 \(first at line 1\)'),
    ('\n', r'ext\.trec: the run file has no lines'),
  ],
)
def test_malformed_line_one_line_error(tmp_path, text, message):
  path = _write(tmp_path, text)
  pipe = make_pipeline(legs={'ext': {'op': 'trec_run', 'path': path}}, name='ext')
  with pytest.raises(EngramError, match=message) as e:
    _arrays(_episode(), pipe)
  assert '\n' not in str(e.value)


def test_no_file_one_line_error(tmp_path):
  for path, message in (('', 'path is empty'), (str(tmp_path / 'absent.trec'), 'cannot read the run file')):
    pipe = make_pipeline(legs={'ext': {'op': 'trec_run', 'path': path}}, name='ext')
    with pytest.raises(EngramError, match=message):
      build_options([pipe])


def test_contract():
  check_operator('trec_run')


def test_our_own_run_file_fed_back_retrieves_the_same(tmp_path):
  """Runs out, then in: a pipeline's TREC run (engram_jax.eval.trec) read by trec_run retrieves the same top-k."""
  from engram_jax.eval.trec import trec_qids
  from engram_jax.eval.trec import trec_run as write_run
  from engram_jax.testing.episodes import random_episode

  rng = np.random.default_rng(3)
  drawn = [random_episode(rng, n, q, dim=8, name=f'e{i}') for i, (n, q) in enumerate([(20, 3), (26, 4)])]
  episodes, emb = [d[0] for d in drawn], [(d[1], d[2]) for d in drawn]
  bm25 = make_pipeline(legs={'bm25': {'op': 'bm25'}}, name='bm25')
  res = evaluate(episodes, emb, {'bm25': bm25}, k=5, metrics=['ndcg@5'], seed=0, progress=False)
  path = _write(tmp_path, write_run(trec_qids(res.episode_ids, res.question_ids), res.retrieved['bm25'], tag='bm25'))
  ext = make_pipeline(legs={'ext': {'op': 'trec_run', 'path': path}}, name='ext')
  back = evaluate(episodes, emb, {'ext': ext}, k=5, metrics=['ndcg@5'], seed=0, progress=False)
  assert back.retrieved['ext'] == res.retrieved['bm25']
