"""A fitted pipeline that retrieves (:func:`engram_jax.retrieve`): label-free questions against one's own items rank
as the artifact's hard scorer ranks them; an artifact records the modules its operators need and imports them in a
fresh process that never imported them; a missing fit, an unknown component or an unimportable module is one line."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import textwrap

import numpy as np
import optax
import pytest
from run_script import script_result

import engram_jax as ej
from engram_jax import fit
from engram_jax.core import runfolder
from engram_jax.core.errors import EngramError
from engram_jax.data import hashing_encoder
from engram_jax.data.embed import spec_hash
from engram_jax.eval.pipeline import build_options
from engram_jax.fit import adapter as A
from engram_jax.fit import artifact
from engram_jax.fit import conditioned as C
from engram_jax.metrics.labels import ndcg_at_k
from engram_jax.testing.synthetic import toy_fit_data

ADAPTER = A.Adapter(rank=2, lr_scale=0.5, soft_query_legs=True)
COND = C.Conditioning(knobs=('legs.bm25.weight',), features=('cues', 'pool'), hidden=0, rank=2, net_lr_scale=1.0)
HASHING = {'model_id': 'hashing-64', 'encoder': {'_target_': 'engram_jax.data.embed.hashing_encoder', 'dim': 64}}


def _artifact(path, components=(), pipe_node=None, modules=(), final=True, params=('legs.bm25.weight', 'k0')):
  episodes, embeddings, arrays, pipe = toy_fit_data()
  if pipe_node is not None:
    pipe = artifact.pipeline_from_node('hybrid', pipe_node)
    arrays = [ej.episode_arrays(e, *x, **build_options([pipe])) for e, x in zip(episodes, embeddings)]
  params = list(params)
  problem, knobs, every = fit.make_problem(pipe, params)
  rows = fit.build_rows(problem, pipe, episodes, arrays, seed=0)
  inputs = {c.name: c.inputs(problem, episodes, arrays) for c in components}
  res = fit.fit(
    problem, knobs, every, rows, np.arange(24), fit.Schedule(optax.adam(0.2), steps=4, batch_size=8),
    components=components, inputs=inputs,
  )  # fmt: skip
  node = pipe_node or {'legs': {'cos': {'op': 'cosine'}, 'bm25': {'op': 'bm25'}}, 'fusion': 'rrf'}
  label = 'final' if final else 'fold_00'
  artifact.save(
    path, pipe_name='hybrid', pipe_node=node, params=params, k=10, components=components, fits={label: res},
    scored={label: []}, train_questions={label: ['x']}, train_episodes={label: ['e0', 'e1']},
    info={'embedder': HASHING, 'embedder_spec_sha256': spec_hash(hashing_encoder(dim=64).spec)}, modules=modules,
  )  # fmt: skip
  return episodes, embeddings


@pytest.mark.parametrize('components', [(), (ADAPTER, COND)], ids=['knobs', 'adapter+conditioned'])
def test_label_free_retrieval_ranks_as_the_scorer(tmp_path, components):
  episodes, embeddings = _artifact(tmp_path / 'art', components)
  art = ej.load_artifact(tmp_path / 'art')
  # the toy vectors are random, not the recorded embedder's: applied with force=True (the guard's own test below)
  want = art.scorer('final')(episodes, embeddings, k=10, metrics=('ndcg@10',), force=True)['ndcg@10']
  got = []
  for ep, (docs, queries) in zip(episodes, embeddings):
    free = [dataclasses.replace(q, gold=(), gold_parents=()) for q in ep.questions]  # no labels reach retrieve
    top = ej.retrieve(art, ep.items, free, k=10, item_vectors=docs, question_vectors=queries, force=True)
    assert all(len(r.ids) == 10 and np.all(np.diff(r.scores) <= 0) for r in top)
    index = ep.index_of()
    topk = np.asarray([[index[i] for i in r.ids] for r in top])
    labels = np.zeros((len(ep.questions), ep.n_items), bool)
    for j, q in enumerate(ep.questions):
      labels[j, [index[g] for g in q.gold]] = True
    got.append(np.asarray(ndcg_at_k(topk, labels, k=10)))
  np.testing.assert_allclose(np.concatenate(got), want, atol=1e-6)


def test_texts_are_embedded_with_the_artifacts_encoder(tmp_path):
  _artifact(tmp_path / 'art')
  art = ej.load_artifact(tmp_path / 'art')
  memory = ['I adopted a dog named Rex.', 'The invoice is overdue.', 'We hiked in the Alps in May.']
  top = ej.retrieve(art, memory, ['Which dog did I adopt?', 'the overdue invoice'], k=2)
  assert [r.ids[0] for r in top] == ['0', '1'] and all(len(r.ids) == 2 for r in top)
  enc = hashing_encoder(dim=64)
  given = ej.retrieve(art, memory, ['Which dog did I adopt?'], k=3, embedder=enc)
  vecs = ej.retrieve(
    art,
    memory,
    ['Which dog did I adopt?'],
    k=3,
    item_vectors=enc(memory),
    question_vectors=enc(['Which dog did I adopt?']),
    embedder=enc,  # vouches for the given vectors
  )
  assert given[0].ids == vecs[0].ids and np.array_equal(given[0].scores, vecs[0].scores)


def test_one_line_refusals(tmp_path):
  _artifact(tmp_path / 'art', final=False)
  art = ej.load_artifact(tmp_path / 'art')
  for call in (
    lambda: art.scorer('final'),
    lambda: ej.retrieve(art, ['a'], ['b'], embedder=lambda t: np.eye(len(t), 4)),
  ):
    with pytest.raises(EngramError, match=r"has no fit 'final'; it has \['fold_00'\] \(fit with fit.final=true") as e:
      call()
    assert '\n' not in str(e.value)
  manifest = json.loads((tmp_path / 'art' / 'manifest.json').read_text())
  manifest['components'] = [{'name': 'lengthy', 'scale': 1.0}]
  (tmp_path / 'art' / 'manifest.json').write_text(json.dumps(manifest))
  with pytest.raises(EngramError, match=r"unknown component 'lengthy'; registered: \['adapter', 'conditioned'\]"):
    ej.load_artifact(tmp_path / 'art')
  with pytest.raises(EngramError, match='no items to rank'):
    ej.retrieve(ej.make_pipeline(legs={'bm25': {'op': 'bm25'}}), [], ['q'], embedder=lambda t: np.eye(len(t), 4))


OOT = '''
"""An out-of-tree operator: cosine scaled by a constant (registered on import)."""
from engram_jax.ops import Knob, Operator, register
from engram_jax.ops.cosine import cosine_scores


def half_leg(ep, key, *, s: float = 0.5):
  del key
  return s * cosine_scores(ep.queries, ep.docs, where=ep.where)


register(Operator('oot_half_cosine', half_leg, (Knob('s', 0.5),), doc='cosine times s'), replace=True)
'''

FRESH = """
import json, sys
import engram_jax as ej
before = 'oot_retrieve_op' in sys.modules
art = ej.load_artifact({path!r})
top = ej.retrieve(art, {memory!r}, ['Which dog did I adopt?'], k=3)
print('RESULT ' + json.dumps({{'before': before, 'after': 'oot_retrieve_op' in sys.modules, 'modules':
  art.manifest['modules'], 'ids': top[0].ids, 'scores': top[0].scores.tolist()}}))
"""


def test_an_artifact_loads_in_a_fresh_process_that_never_imported_its_operator(tmp_path, monkeypatch):
  pkg = tmp_path / 'oot'
  pkg.mkdir()
  (pkg / 'oot_retrieve_op.py').write_text(OOT)
  monkeypatch.syspath_prepend(str(pkg))
  import oot_retrieve_op  # noqa: F401 - registers the operator, as a run's ops_modules does

  node = {'legs': {'cos': {'op': 'cosine'}, 'bm25': {'op': 'bm25'}, 'half': {'op': 'oot_half_cosine'}}, 'fusion': 'rrf'}
  try:
    _artifact(tmp_path / 'art', pipe_node=node)
    memory = ['I adopted a dog named Rex.', 'The invoice is overdue.', 'We hiked in the Alps in May.']
    here = ej.retrieve(ej.load_artifact(tmp_path / 'art'), memory, ['Which dog did I adopt?'], k=3)
  finally:
    from engram_jax.ops import OPERATORS

    OPERATORS.pop('oot_half_cosine', None)
  script = textwrap.dedent(FRESH.format(path=str(tmp_path / 'art'), memory=memory))
  monkeypatch.setenv('PYTHONPATH', str(pkg))
  out = script_result(script, timeout=200)
  assert out['modules'] == ['oot_retrieve_op'] and not out['before'] and out['after']
  assert out['ids'] == here[0].ids and np.allclose(out['scores'], here[0].scores)
  monkeypatch.delenv('PYTHONPATH')
  with pytest.raises(AssertionError, match=r"needs module 'oot_retrieve_op', which cannot be imported .*PYTHONPATH"):
    script_result(script, timeout=200)


def test_the_fitting_docs_quickstart_runs(tmp_path, monkeypatch):
  """docs/fitting.md's retrieval quickstart, executed as written against an artifact at the path it names."""
  import re
  from pathlib import Path

  page = (Path(__file__).resolve().parents[2] / 'docs' / 'fitting.md').read_text()
  section = page.split('### Retrieve with a fitted pipeline', 1)[1].split('\n#', 1)[0]
  (src,) = re.findall(r'^```python\n(.*?)^```', section, re.S | re.M)
  run = tmp_path / 'outputs' / 'fit' / 'cfsr_final'
  _artifact(run / 'artifact' / 'fitted')
  runfolder.mark(run, [p.relative_to(run).as_posix() for p in run.rglob('*') if p.is_file()])  # a whole run folder
  monkeypatch.chdir(tmp_path)
  exec(compile(src, 'docs/fitting.md [python]', 'exec'), {'__name__': 'docs'})


def _refused(call, pattern):
  with pytest.raises(EngramError, match=pattern) as e:
    call()
  assert '\n' not in str(e.value), str(e.value)


def test_the_road_refuses_what_it_cannot_score_honestly(tmp_path, caplog):
  """Issue 50 item 1. Before: another embedder of the same dimension ranked silently, another dimension ranked
  silently, one question as a string ranked one question per character, items as one string became one item per
  character, k=2.7 was taken as 2, k=0 gave an empty list and k=-1 raised JAX's error; an edited manifest value was
  applied. Each is now one line (or, forced, a warning)."""
  _artifact(tmp_path / 'art')
  art = ej.load_artifact(tmp_path / 'art')
  memory = ['I adopted a dog named Rex.', 'The invoice is overdue.', 'We hiked in the Alps in May.']
  ask = ['Which dog did I adopt?']
  other = hashing_encoder(dim=64, seed=1)  # same dimension, other vectors
  _refused(lambda: ej.retrieve(art, memory, ask, embedder=other), r'/art: the artifact was fitted on embeddings of')
  _refused(
    lambda: ej.retrieve(art, memory, ask, item_vectors=other(memory), question_vectors=other(ask)),
    r'nothing says which embedder made these vectors .*force=True to apply it anyway',
  )
  wide = hashing_encoder(dim=32)
  _refused(
    lambda: ej.retrieve(art, memory, ask, item_vectors=wide(memory), question_vectors=wide(ask), embedder=wide),
    r'/art: the artifact was fitted on embeddings of .hashing-64., these vectors come from an encoder of another spec',
  )
  with caplog.at_level('WARNING'):
    forced = ej.retrieve(art, memory, ask, embedder=other, force=True)
  assert len(forced[0].ids) == 3 and 'force=True: applying' in caplog.text
  _refused(lambda: ej.retrieve(art, memory, 'Which dog did I adopt?'), r'^questions: expected a list, got one str')
  _refused(lambda: ej.retrieve(art, 'I adopted a dog.', ask), r'^items: expected a list, got one str')
  for k in (2.7, 0, -1, True, '3'):
    _refused(lambda k=k: ej.retrieve(art, memory, ask, k=k), rf'^k must be a positive integer, got {k!r}')
  assert [len(r.ids) for r in ej.retrieve(art, memory, ask, k=2.0)] == [2]
  manifest = json.loads((tmp_path / 'art' / 'manifest.json').read_text())
  manifest['fits'][0]['values']['k0'] = 999.0
  (tmp_path / 'art' / 'manifest.json').write_text(json.dumps(manifest))
  _refused(lambda: ej.load_artifact(tmp_path / 'art'), r"manifest.json: fit 'final' says k0 = 999.0, its tensors give")


def test_an_adapter_refuses_another_dimension_in_one_line(tmp_path):
  """Before: JAX's shape error from inside the adapter."""
  _artifact(tmp_path / 'art', (ADAPTER,))
  art = ej.load_artifact(tmp_path / 'art')
  wide = hashing_encoder(dim=32)
  _refused(
    lambda: ej.retrieve(art, ['a dog', 'a cat'], ['dog?'], embedder=wide, force=True),
    r'fitted on 8-dimensional vectors, these are 32-dimensional; its adapter cannot apply to them \(not even with '
    r'force=True\)$',
  )


def test_an_external_run_leg_is_pinned_and_refused_by_retrieve(tmp_path):
  """Before: replacing the run file's content under the same path was scored with no message (ndcg@10 0.8624 ->
  0.0000), and retrieve silently dropped the leg."""
  from engram_jax.eval import trec

  episodes, embeddings, _, _ = toy_fit_data()
  run = tmp_path / 'ext.trec'
  lines = [
    f'{trec.trec_id(q.id)} Q0 {trec.trec_id(g)} 1 1.0 ext' for e in episodes for q in e.questions for g in q.gold
  ]
  run.write_text('\n'.join(lines) + '\n')
  node = {'legs': {'cos': {'op': 'cosine'}, 'ext': {'op': 'trec_run', 'path': str(run)}}, 'fusion': 'rrf'}
  _artifact(tmp_path / 'art', pipe_node=node, params=('legs.ext.weight', 'k0'))
  art = ej.load_artifact(tmp_path / 'art')
  assert art.manifest['runs'] == {str(run.resolve()): hashlib.sha256(run.read_bytes()).hexdigest()}
  scored = art.scorer('final')(episodes, embeddings, k=10, force=True)['ndcg@10']
  assert scored.mean() > 0.5
  _refused(
    lambda: ej.retrieve(art, ['a dog'], ['dog?'], embedder=hashing_encoder(dim=64)),
    rf"/art: leg 'ext' reads the external run {run}, which ranks its own questions only; retrieve cannot serve",
  )
  run.write_text('\n'.join(lines[::-1]) + '\n')  # same path, other content
  _refused(
    lambda: art.scorer('final')(episodes, embeddings, k=10, force=True),
    rf"/art: leg 'ext' reads the run file {run}, which changed since the fit \(sha256 ",
  )
