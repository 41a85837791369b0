"""Evidence boundary: parent vs exact recall by hand, the bounded expansion policy, the parent_recall@k metric in
evaluate(), and the experiments.research.boundary_table entry point on one LoCoMo conversation."""

import json

import numpy as np
import pytest

from engram_jax.core.types import Episode, Item, Question
from engram_jax.data import io
from engram_jax.eval import evaluation
from engram_jax.metrics import boundary

try:
  HAVE = (io.resolve_data_root() / 'locomo' / 'locomo10.json').is_file()
except FileNotFoundError:
  HAVE = False
real = pytest.mark.skipif(not HAVE, reason='LoCoMo not found under the data root')


def _episode():
  # parents: A = a0 a1 a2 (3+3+3 = 9 tokens), B = b0 b1 (2+2 = 4), C = c0..c3 (10 each = 40)
  text = {
    'a0': 'w w w',
    'a1': 'w w w',
    'a2': 'w w w',
    'b0': 'w w',
    'b1': 'w w',
    'c0': ' '.join(['w'] * 10),
    'c1': ' '.join(['w'] * 10),
    'c2': ' '.join(['w'] * 10),
    'c3': ' '.join(['w'] * 10),
  }
  items = tuple(Item(id=i, text=t, parent=i[0].upper(), position=n) for n, (i, t) in enumerate(text.items()))
  qs = (
    Question(id='q0', text='?', gold=('a2', 'c3'), gold_parents=('A', 'C'), category=1),
    Question(id='q1', text='?', gold=('b1',), gold_parents=(), category=2),
  )
  return Episode(id='e', items=items, questions=qs)


def test_parent_and_exact_recall_by_hand():
  ep = _episode()
  q0, q1 = ep.questions
  assert boundary.exact_recall(['a0', 'c0'], q0.gold) == 0.0
  assert boundary.parent_recall(['a0', 'c0'], ep, q0) == 1.0  # right parents, wrong passages
  assert boundary.parent_recall(['a0', 'b0'], ep, q0) == 0.5
  assert boundary.exact_recall(['c3', 'a2', 'b0'], q0.gold, k=1) == 0.5
  assert boundary.gold_parents(ep, q1) == {'B'}  # no gold_parents given: the gold items' parents
  assert boundary.parent_recall(['b0'], ep, q1) == 1.0


def test_expansion_policy():
  ep = _episode()
  ix = boundary.ParentIndex(ep, boundary.whitespace_tokens)
  assert ix.parent_tokens == {'A': 9, 'B': 4, 'C': 40}
  none = boundary.expand_to_parents(['a0', 'c0'], ix, max_parent_tokens=0)
  assert none.ids == ('a0', 'c0') and none.tokens == none.base_tokens == 13 and none.expanded == ()
  # C is too large for the parent cap; A is expanded (siblings in write order after the retrieved items).
  x = boundary.expand_to_parents(['c0', 'a1'], ix, max_parent_tokens=20)
  assert x.ids == ('c0', 'a1', 'a0', 'a2') and x.tokens == 10 + 9 and x.expanded == ('A',) and x.skipped == ('C',)
  # The whole-packet budget (retrieved: 15 tokens): A (+6) fits 21 <= 21, then B (+2) does not, ...
  y = boundary.expand_to_parents(['a0', 'c0', 'b0'], ix, max_parent_tokens=None, budget=21)
  assert y.expanded == ('A',) and y.skipped == ('C', 'B') and y.tokens == 15 + 6
  # ... and with budget 17 A is skipped (21 > 17) while the later, smaller B still fits (15 + 2 <= 17).
  z = boundary.expand_to_parents(['a0', 'c0', 'b0'], ix, max_parent_tokens=None, budget=17)
  assert z.expanded == ('B',) and z.tokens == 17 and set(z.ids) == {'a0', 'c0', 'b0', 'b1'}
  everything = boundary.expand_to_parents(['c1', 'a0', 'b1'], ix, max_parent_tokens=None, budget=None)
  assert set(everything.ids) == {it.id for it in ep.items} and everything.tokens == 53
  with pytest.raises(KeyError, match='zz'):
    boundary.expand_to_parents(['zz'], ix, max_parent_tokens=None)


def test_boundary_scores_and_same_budget_control():
  ep = _episode()
  q0, q1 = ep.questions
  ranked = ['a0', 'c0', 'b0', 'a2', 'c3', 'b1', 'a1', 'c1', 'c2']
  s = boundary.boundary_scores([(ep, q0, ranked), (ep, q1, ranked)], k=2, max_parent_tokens=10)
  assert s.exact == [0.0, 0.0] and s.parent == [1.0, 0.0]
  assert s.expanded == [0.5, 0.0]  # A expanded (a2 found), C too large (c3 not)
  assert s.tokens == [19.0, 19.0] and s.base_tokens == [13.0, 13.0] and s.expanded_parents == [1.0, 1.0]
  # same budget (19 tokens) spent on the ranking instead: a0 c0 b0 (15), a2 would make 18, c3 would make 28
  assert s.same_budget == [0.5, 0.0] and s.same_budget_short == [0.0, 0.0]
  assert boundary.boundary_scores([(ep, q0, ranked[:2])], k=2, max_parent_tokens=10).same_budget is None
  assert boundary.chars4_tokens('abcde') == 2


def test_parent_recall_metric_matches_boundary():
  ep = _episode()
  rng = np.random.default_rng(0)
  index = ep.index_of()
  for _ in range(20):
    ranked = rng.permutation(ep.n_items).tolist()
    for q in ep.questions:
      for k in (1, 3, 5):
        want = boundary.parent_recall([ep.items[i].id for i in ranked], ep, q, k=k)
        assert boundary.parent_recall_at(ep, q, ranked, k) == pytest.approx(want)
  assert index  # the metric reads items by row index, as evaluate() passes them


def test_parent_recall_in_evaluate():
  from engram_jax.data import embed
  from engram_jax.eval import pipeline

  ep = _episode()
  enc = embed.hashing_encoder(16)
  embs = evaluation.embed_episodes([ep], enc)
  pipes = {'cos': pipeline.make_pipeline(legs={'cos': {'op': 'cosine'}}, name='cos')}
  res = evaluation.evaluate(
    [ep],
    embs,
    pipes,
    k=3,
    metrics=['parent_recall@3', 'recall@3'],
    seed=0,
    progress=False,
    episode_metrics={'parent_recall': boundary.parent_recall_at},
  )
  for i, q in enumerate(ep.questions):
    got = res.scores['cos']['parent_recall@3'][i]
    assert got == pytest.approx(boundary.parent_recall(res.retrieved['cos'][i], ep, q))
    assert got >= 0.0


@pytest.mark.slow
@real
def test_entry_point_on_one_conversation(tmp_path):
  from experiments.research import boundary_table as entry

  out = tmp_path / 'run'
  entry.main(
    [
      '--evaluate',
      'experiment=boundary',
      'pipeline=[cosine,bm25]',
      'embedder=hashing',
      'eval.k=40',
      'dataset.loader.conversations=[conv-30]',
      'eval.n_resamples=100',
      'eval.progress=false',
      'dataset.metrics=[recall@10,parent_recall@10]',
      f'paths.cache_dir={tmp_path}/cache',
      '--out',
      str(out),
      '--k',
      '10',
      '--policy',
      '0:inf',
      '300:1000',
      '--n-resamples',
      '100',
    ]
  )
  rows = json.loads((out / 'boundary.json').read_text())['locomo']
  assert [(r['pipeline'], r['policy']) for r in rows] == [
    ('cosine', '0:inf'),
    ('cosine', '300:1000'),
    ('bm25', '0:inf'),
    ('bm25', '300:1000'),
  ]
  res = json.loads((out / 'results.json').read_text())
  for r in rows:
    assert r['n'] == res['n_questions'] == 105 and r['k'] == 10
    # the run's own parent_recall@10 and recall@10 are the boundary table's parent and exact recall
    assert r['parent_recall'][0] == pytest.approx(res['pipelines'][r['pipeline']]['parent_recall@10'])
    assert r['exact_recall'][0] == pytest.approx(res['pipelines'][r['pipeline']]['recall@10'])
    assert r['expanded_recall'][0] >= r['exact_recall'][0]
    assert r['budget'] in (None, 1000) and 'same_budget_recall' in r
    if r['policy'] == '0:inf':
      assert r['tokens'][0] == r['base_tokens'][0] and r['gain']['delta'] == 0.0
    else:
      assert r['tokens'][0] <= 1000
  assert '| cosine | 300:1000 |' in (out / 'boundary.md').read_text()
