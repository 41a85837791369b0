"""Pipelines on synthetic episodes: equal k, bad input, tie rule end to end."""

import numpy as np
import pytest

from engram_jax.core import batch
from engram_jax.core.types import Episode, Item, Question
from engram_jax.eval import evaluation, pipeline


def _episode(n=12, nq=3, eid='e'):
  items = tuple(Item(id=f'i{j}', text=f'item {j} word{j % 3}', parent=f'p{j // 4}', position=j) for j in range(n))
  qs = tuple(
    Question(id=f'{eid}/q{j}', text=f'word{j % 3}', gold=(f'i{j}',), gold_parents=(f'p{j // 4}',), category=1 + j % 2)
    for j in range(nq)
  )
  return Episode(id=eid, items=items, questions=qs)


def _emb(ep, seed=0, d=8):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(ep.n_items + len(ep.questions), d)).astype(np.float32)
  x /= np.linalg.norm(x, axis=1, keepdims=True)
  return x[: ep.n_items], x[ep.n_items :]


def _pipes():
  cos = {'op': 'cosine', 'depth': 10}
  bm = {'op': 'bm25', 'depth': 10}
  return {
    'cosine': pipeline.make_pipeline(legs={'cos': cos}),
    'rrf': pipeline.make_pipeline(legs={'cos': cos, 'bm25': bm}, fusion='rrf'),
  }


def test_equal_k_and_metrics_in_range():
  eps = [_episode(12, 3, 'a'), _episode(20, 5, 'b')]
  res = evaluation.evaluate(
    eps, [_emb(e) for e in eps], _pipes(), k=5, metrics=['ndcg@5', 'recall@5'], seed=0, progress=False
  )
  assert len(res.question_ids) == 8
  for name in res.retrieved:
    assert all(len(r) == 5 and len(set(r)) == 5 for r in res.retrieved[name])
    assert np.all((res.scores[name]['ndcg@5'] >= 0) & (res.scores[name]['ndcg@5'] <= 1))


def test_k_larger_than_episode_is_a_clear_error():
  ep = _episode(4, 2)
  with pytest.raises(ValueError, match='k=10 is larger than episode e'):
    evaluation.evaluate([ep], [_emb(ep)], _pipes(), k=10, metrics=['ndcg@10'], seed=0, progress=False)
  with pytest.raises(ValueError, match='needs 10 results'):
    evaluation.evaluate([ep], [_emb(ep)], _pipes(), k=3, metrics=['ndcg@10'], seed=0, progress=False)
  with pytest.raises(ValueError, match='Unknown metric'):
    evaluation.evaluate([ep], [_emb(ep)], _pipes(), k=3, metrics=['map@3'], seed=0, progress=False)


def test_nan_embeddings_are_a_clear_error():
  ep = _episode()
  docs, qs = _emb(ep)
  docs[3, 0] = np.nan
  with pytest.raises(ValueError, match='1 item embeddings contain NaN'):
    batch.episode_arrays(ep, docs, qs)


def test_tie_rule_end_to_end_prefers_recent_items():
  ep = _episode(12, 1)
  docs = np.tile(np.eye(8, dtype=np.float32)[0], (12, 1))  # every item identical: all ties
  qs = np.eye(8, dtype=np.float32)[:1]
  res = evaluation.evaluate(
    [ep], [(docs, qs)], {'cosine': _pipes()['cosine']}, k=3, metrics=['recall@3'], seed=0, progress=False
  )
  assert res.retrieved['cosine'][0] == ['i11', 'i10', 'i9']


def test_bad_pipeline_specs():
  with pytest.raises(ValueError, match=r"fusion must be one of \['none', 'rrf'\], got 'max'"):
    pipeline.make_pipeline(legs={'cos': {'op': 'cosine'}}, fusion='max')
  with pytest.raises(ValueError, match='exactly one leg'):
    pipeline.make_pipeline(legs={'cos': {'op': 'cosine'}, 'cos2': {'op': 'cosine'}})
  with pytest.raises(ValueError, match="unknown operator 'nope'"):
    pipeline.make_pipeline(legs={'x': {'op': 'nope'}}, name='p')
  with pytest.raises(ValueError, match='leg names must be unique'):
    pipeline.make_pipeline(legs=[pipeline.LegSpec('cos', 'cosine')] * 2, fusion='rrf')


def test_episode_validation():
  with pytest.raises(ValueError, match='duplicate item ids'):
    Episode(id='x', items=(Item('a', 't', 'p', 0), Item('a', 't', 'p', 1)), questions=())
  with pytest.raises(ValueError, match='unknown gold'):
    Episode(id='x', items=(Item('a', 't', 'p', 0),), questions=(Question('q', 't', ('b',), (), 1),))


def _stack_pipes():
  return {
    **_pipes(),
    'cfsr': pipeline.make_pipeline(legs={'cfsr': {'op': 'cfsr', 'pool': 20, 'iterations': 10}}),
    'tide': pipeline.make_pipeline(legs={'tide': {'op': 'tide', 'pool': 8, 'recency': 0.3}}),
    'mmr': pipeline.make_pipeline(
      fusion='rrf', legs={'cos': {'op': 'cosine'}, 'mmr': {'op': 'mmr', 'k': 6, 'lam': 0.6}}
    ),
    'cos2': pipeline.make_pipeline(fusion='rrf', legs={'cos': {'op': 'cosine'}, 'cos2': {'op': 'cos2', 'eps': 0.5}}),
  }


def _compile_requests(eps, pipes, **kw):
  from engram_jax.eval import timing

  timer = timing.RunTimer()
  res = evaluation.evaluate(
    eps,
    [_emb(e, seed=i) for i, e in enumerate(eps)],
    pipes,
    k=5,
    metrics=['ndcg@5', 'recall@5', 'mrr@5'],
    seed=3,
    progress=False,
    timer=timer,
    **kw,
  )
  return res, timer.stop()['compile_requests']


@pytest.mark.slow
def test_stacked_episodes_give_the_same_results_as_episode_by_episode():
  eps = [_episode(12, 3, 'a'), _episode(140, 70, 'b'), _episode(30, 5, 'c'), _episode(300, 9, 'd')]
  pipes = _stack_pipes()
  plain, n_plain = _compile_requests(eps, pipes, stacked=False)
  for waste in (2.0, float('inf')):  # a few size groups, or all four episodes in one
    res, n_stacked = _compile_requests(eps, pipes, stacked=True, max_waste=waste)
    assert res.retrieved == plain.retrieved  # cos2 included: its noise does not depend on the padding
    for name in plain.scores:
      for m in plain.scores[name]:
        assert np.array_equal(res.scores[name][m], plain.scores[name][m])
    assert n_stacked < n_plain
  assert n_stacked <= len(pipes) + 1  # one group: one compilation per pipeline (+ the keys; metrics are NumPy)


@pytest.mark.slow
def test_stacked_compile_count_does_not_grow_with_the_number_of_episodes():
  pipes = {n: p for n, p in _stack_pipes().items() if n in ('cosine', 'rrf', 'cfsr')}
  few = [_episode(40 + i, 4, f'f{i}') for i in range(2)]
  many = [_episode(40 + i, 4 + i % 3, f'm{i}') for i in range(7)]
  _compile_requests([_episode(20, 2, 'w')], pipes)  # the eager helpers (key folding) compile once per process
  (_, n_few), (_, n_many) = _compile_requests(few, pipes), _compile_requests(many, pipes)
  assert n_few == n_many == len(pipes)
  arrays = [batch.episode_arrays(e, *_emb(e, seed=i)) for i, e in enumerate(many)]
  assert batch.stack_groups(arrays) == [list(range(7))]
  assert len(batch.stack_groups(arrays, max_waste=1.0)) > 1
