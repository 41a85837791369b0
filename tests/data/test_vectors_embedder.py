"""The vectors embedder (engram_jax.data.vectors, conf/embedder/vectors.yaml): a round trip through the file is bit
for bit, the cache key is the content, and every bad file is one line before any work (issue 42 item 2).

The probes go through ``common.make_embedder`` (what ``experiments.evaluate`` calls before loading any data), the id
probes through ``lookup`` and through ``experiments.evaluate`` right after loading (before embedding or retrieval).
"""

import dataclasses
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from engram_jax.core.errors import DataNotFoundError, EngramError
from engram_jax.data import io, vectors
from engram_jax.eval import evaluation
from engram_jax.testing.synthetic import synthetic_episodes
from experiments import evaluate
from experiments.lib import common

CONF = str(Path(__file__).resolve().parents[2] / 'conf')
try:
  HAVE = (io.resolve_data_root() / 'locomo' / 'locomo10.json').is_file()
except FileNotFoundError:
  HAVE = False


def _data(dim=16):
  eps = synthetic_episodes(n_episodes=2, n_queries=4, dim=dim, n_items=(12, 14), seed=3)
  return [e.episode for e in eps], [(e.docs, e.queries) for e in eps]


def _arrays(dim=16):
  """The arrays of a good file of the synthetic episodes (as write_vectors writes them)."""
  episodes, embeddings = _data(dim)
  arrays = {'model_id': np.asarray('toy')}
  for kind in vectors.KINDS:
    keys, texts, vecs = vectors.file_rows(episodes, embeddings, kind)
    arrays[f'{kind}s'] = vecs
    arrays[f'{kind}_episodes'] = np.asarray([e for e, _ in keys], dtype=str)
    arrays[f'{kind}_ids'] = np.asarray([i for _, i in keys], dtype=str)
    arrays[f'{kind}_texts_sha256'] = np.asarray([vectors.text_sha256(t) for t in texts], dtype=str)
  return arrays


def _save(path, arrays):
  with open(path, 'wb') as f:
    np.savez(f, **arrays)
  return str(path)


def _embedder(path, *overrides):
  with initialize_config_dir(config_dir=CONF, version_base='1.3'):
    cfg = compose(config_name='config', overrides=['embedder=vectors', f'embedder.path={path}', *overrides])
  return cfg, common.make_embedder(cfg)


def test_round_trip_is_bit_for_bit_and_labelled(tmp_path):
  episodes, embeddings = _data()
  info = vectors.write_vectors(tmp_path / 'v.npz', episodes, embeddings, model_id='toy-model')
  assert (info['items'], info['questions'], info['dim']) == (sum(e.n_items for e in episodes), 8, 16)
  with initialize_config_dir(config_dir=CONF, version_base='1.3'):
    composed = compose(config_name='config', overrides=['embedder=vectors', f'embedder.path={tmp_path / "v.npz"}'])
  assert composed.embedder.model_id == 'toy-model'  # the file's label is the run's, resolved at composition
  cfg, embed_fn = _embedder(tmp_path / 'v.npz')
  assert cfg == composed  # make_embedder changes nothing in the config (a fit's artifact compares it)
  back = evaluation.embed_episodes(episodes, embed_fn)
  for (d0, q0), (d1, q1) in zip(embeddings, back):
    assert d1.dtype == np.float32 and np.array_equal(d0, d1) and np.array_equal(q0, q1)
  (report,) = embed_fn.cache_reports
  assert report['normalised'] == 0 and report['texts_checked'] and report['unused_item_rows'] == 0
  # a subset of the episodes: the other rows are counted as unused, not refused
  evaluation.embed_episodes(episodes[:1], embed_fn)
  assert embed_fn.cache_reports[-1]['unused_item_rows'] == episodes[1].n_items
  with pytest.raises(EngramError, match='cannot embed 2 texts'):
    embed_fn(['a', 'b'])


def test_label_without_model_id_is_the_stem(tmp_path):
  arrays = _arrays()
  arrays.pop('model_id')
  path = _save(tmp_path / 'bge-small.npz', arrays)
  assert vectors.file_model_id(path) == 'bge-small' == vectors.read_vectors(path).model_id
  assert vectors.file_model_id(tmp_path / 'nowhere.npz') == 'nowhere' and vectors.file_model_id(None) == 'vectors'
  assert _embedder(path, 'embedder.model_id=my-label')[0].embedder.model_id == 'my-label'


def test_cache_key_is_the_content_not_the_path(tmp_path):
  arrays = _arrays()
  a, b = _save(tmp_path / 'a.npz', arrays), _save(tmp_path / 'b.npz', arrays)
  spec_a, spec_b = vectors.vectors_encoder(a).spec, vectors.vectors_encoder(b).spec
  assert spec_a == spec_b and spec_a['sha256'] == vectors.read_vectors(a).sha256
  assert a not in str(spec_a) and vectors.read_vectors(b).path == b  # named as asked, keyed by content
  arrays['items'] = arrays['items'][:, ::-1].copy()
  _save(tmp_path / 'a.npz', arrays)  # the same path, new content: another key
  assert vectors.vectors_encoder(a).spec['sha256'] != spec_a['sha256']


def _set(key, value):
  def edit(arrays):
    arrays[key] = value(arrays) if callable(value) else value

  return edit


def _row(key, row, value):
  def edit(arrays):
    arrays[key] = arrays[key].copy()
    arrays[key][row] = value

  return edit


def _drop(key):
  return lambda arrays: arrays.pop(key)


# probe | what is done to a good file | the one-line message (regex)
PROBES = [
  ('empty file', None, r'an empty file \(0 bytes\)'),
  ('not an npz', b'id,vector\nD1:1,0.1\n', r'not a readable \.npz archive \(not a zip archive\)'),
  ('a .npy array', 'npy', r'not a readable \.npz archive \(a single \.npy array\)'),
  ('a zip of other files', 'zip', r"not an \.npz archive: its members \['ids.txt'\] are not numpy arrays"),
  ('empty archive', {}, r'an empty archive \(no arrays\)'),
  ('no rows', _set('items', lambda a: a['items'][:0]), r'holds no item vectors \(items has shape \(0, 16\)\)'),
  ('array missing', _drop('question_ids'), r"lacks the arrays \['question_ids'\]"),
  ('unknown array', _set('vectors', np.zeros((2, 2), np.float32)), r"unknown arrays \['vectors'\]"),
  (
    'ids as objects',
    _set('item_ids', lambda a: np.asarray(a['item_ids'].tolist(), dtype=object)),
    r'holds Python objects .*np\.asarray\(ids, dtype=str\)',
  ),
  ('ids as numbers', _set('item_ids', lambda a: np.arange(len(a['item_ids']))), r'item_ids is a int64 array'),
  ('ids too few', _set('question_ids', lambda a: a['question_ids'][:-1]), r'question_ids has 7 entries for the 8 rows'),
  (
    'wrong dimension (items vs questions)',
    _set('questions', lambda a: a['questions'][:, :8]),
    r'item vectors have 16 dims, question vectors 8',
  ),
  ('NaN row', _row('items', 3, np.nan), r'1 of 2\d item rows hold NaN/inf as float32 \(e\.g\. synthetic-0/s0:3\)'),
  ('inf row', _row('questions', 0, np.inf), r'1 of 8 question rows hold NaN/inf as float32'),
  ('float64 beyond float32', _set('items', lambda a: a['items'].astype(np.float64) * 1e300), r'item rows hold NaN/inf'),
  ('zero row', _row('items', 0, 0.0), r'1 of 2\d item rows are zero vectors'),
  (
    'duplicate ids',
    _row('item_ids', 1, 's0:0'),
    r'1 duplicate item ids \(e\.g\. synthetic-0/s0:0\): one row per \(episode, id\)',
  ),
  ('model_id not a str', _set('model_id', np.asarray(3)), r'model_id is a int64 array'),
]


@pytest.mark.parametrize('probe, edit, match', PROBES, ids=[p[0] for p in PROBES])
def test_bad_file_is_one_line_before_any_work(tmp_path, probe, edit, match):
  path = tmp_path / 'bad.npz'
  if edit is None:
    path.write_bytes(b'')
  elif isinstance(edit, bytes):
    path.write_bytes(edit)
  elif isinstance(edit, dict):
    _save(path, edit)
  elif edit == 'npy':
    np.save(path.open('wb'), np.zeros((2, 3), np.float32))
  elif edit == 'zip':
    with zipfile.ZipFile(path, 'w') as z:
      z.writestr('ids.txt', 'D1:1\n')
  else:
    arrays = _arrays()
    edit(arrays)
    _save(path, arrays)
  with pytest.raises(EngramError, match=match) as e:
    _embedder(path)  # what evaluate, fit and grids call before loading any data
  assert '\n' not in str(e.value) and str(e.value).startswith(f'vectors file {path}: ')


def test_wrong_dimension_against_the_config(tmp_path):
  path = _save(tmp_path / 'v.npz', _arrays())
  with pytest.raises(EngramError, match=r'16-dim vectors, but the embedder says dim 1536') as e:
    _embedder(path, 'embedder.encoder.dim=1536')
  assert '\n' not in str(e.value)
  _embedder(path, 'embedder.encoder.dim=16')
  with pytest.raises(EngramError, match=r'embedder.encoder.dim must be an integer >= 1 or null, got 0'):
    _embedder(path, 'embedder.encoder.dim=0')


def test_writers_write_an_episode_given_twice_once(tmp_path):
  episodes, embeddings = _data()
  info = vectors.write_vectors(tmp_path / 'v.npz', episodes * 2, embeddings * 2, model_id='toy')
  assert info['questions'] == 8 and vectors.read_vectors(tmp_path / 'v.npz').sha256 == info['sha256']
  other = [(d[::-1].copy(), q) for d, q in embeddings]
  with pytest.raises(EngramError, match=r'item synthetic-0/s0:0 appears twice with different texts or vectors'):
    vectors.write_vectors(tmp_path / 'w.npz', episodes * 2, embeddings + other, model_id='toy')
  assert not (tmp_path / 'w.npz').exists()
  texts = vectors.write_texts(tmp_path / 't.jsonl', episodes * 2)
  lines = (tmp_path / 't.jsonl').read_text().splitlines()
  assert texts['questions'] == 8 and len(lines) == texts['items'] + 8
  assert lines[0] == json.dumps(
    {'kind': 'item', 'episode': 'synthetic-0', 'id': 's0:0', 'text': episodes[0].items[0].text}
  )


def test_no_file_and_no_path_are_one_line(tmp_path):
  with pytest.raises(DataNotFoundError, match=r'no such file \(embedder.path\)'):
    _embedder(tmp_path / 'nowhere.npz')
  with pytest.raises(EngramError, match=r'embedder=vectors needs the file: embedder.path=FILE.npz'):
    with initialize_config_dir(config_dir=CONF, version_base='1.3'):
      common.make_embedder(compose(config_name='config', overrides=['embedder=vectors']))


def test_unnormalised_rows_are_normalised_and_counted_or_refused(tmp_path):
  arrays = _arrays()
  good = arrays['items'].copy()
  arrays['items'] = arrays['items'].copy()
  arrays['items'][[2, 5]] *= 3.0  # two rows of norm 3
  arrays['questions'] = arrays['questions'].astype(np.float64) * 0.5  # every question row of norm 0.5, as float64
  path = _save(tmp_path / 'v.npz', arrays)
  f = vectors.read_vectors(path)
  assert f.normalised == 2 + 8 and f.normalised_examples[:2] == ('synthetic-0/s0:2', 'synthetic-0/s0:5')
  assert f.dtype == 'float32' and f.tables['question'].vectors.dtype == np.float32
  items = f.tables['item'].vectors
  np.testing.assert_allclose(np.linalg.norm(items, axis=1), 1.0, atol=1e-6)
  keep = np.ones(len(good), bool)
  keep[[2, 5]] = False
  assert np.array_equal(items[keep], good[keep])  # rows of unit norm: kept bit for bit
  _, embed_fn = _embedder(path)
  evaluation.embed_episodes(_data()[0], embed_fn)
  assert embed_fn.cache_reports[-1]['normalised'] == 10  # the run's report (run_info.json, embedding_cache)
  with pytest.raises(EngramError, match=r'2 of 2\d item rows are not of unit norm .*normalize=true') as e:
    _embedder(path, 'embedder.encoder.normalize=false')
  assert '\n' not in str(e.value)


def test_missing_ids_and_other_texts_are_one_line(tmp_path):
  episodes, _ = _data()
  arrays = _arrays()
  for key in ('items', 'item_episodes', 'item_ids', 'item_texts_sha256'):
    arrays[key] = arrays[key][3:]  # the first three items of synthetic-0 are not in the file
  for key in ('questions', 'question_episodes', 'question_ids', 'question_texts_sha256'):
    arrays[key] = arrays[key][:-1]
  _, embed_fn = _embedder(_save(tmp_path / 'v.npz', arrays))
  with pytest.raises(EngramError) as e:
    evaluation.embed_episodes(episodes, embed_fn)
  n_items = sum(ep.n_items for ep in episodes)
  assert str(e.value) == (
    f'vectors file {tmp_path / "v.npz"}: lacks 3 of {n_items} item ids (e.g. synthetic-0/s0:0, synthetic-0/s0:1, '
    'synthetic-0/s0:2) and 1 of 8 question ids (e.g. synthetic-1/s1/q3) of the episodes to embed: it was written '
    'for other episodes or another dataset option (export the ids with python -m experiments.export_vectors ... '
    'texts=true)'
  )
  other = [
    dataclasses.replace(ep, items=tuple(dataclasses.replace(it, text=it.text + '!') for it in ep.items))
    for ep in episodes
  ]
  _, embed_fn = _embedder(_save(tmp_path / 'w.npz', _arrays()))
  with pytest.raises(
    EngramError, match=rf'{n_items} of {n_items} item texts \(e\.g\. synthetic-0/s0:0, .*\) differ'
  ) as e:
    embed_fn.check(other)
  assert '\n' not in str(e.value)
  arrays = _arrays()
  for kind in vectors.KINDS:
    arrays.pop(f'{kind}_texts_sha256')  # a file without text hashes: matched by id alone
  _, embed_fn = _embedder(_save(tmp_path / 'x.npz', arrays))
  embed_fn.check(other)
  assert not embed_fn.cache_reports  # check() reports nothing; embedding does


@pytest.mark.skipif(not HAVE, reason='LoCoMo not found under the data root')
def test_evaluate_refuses_missing_ids_after_loading_before_embedding(tmp_path, monkeypatch):
  """experiments.evaluate: the ids checked right after loading; nothing is embedded or retrieved."""
  _save(tmp_path / 'v.npz', _arrays())  # synthetic ids: none is a LoCoMo id
  with initialize_config_dir(config_dir=CONF, version_base='1.3'):
    cfg = compose(
      config_name='config',
      overrides=[
        'embedder=vectors',
        f'embedder.path={tmp_path / "v.npz"}',
        'dataset.loader.conversations=[conv-26]',
        'pipeline=[cosine]',
        f'paths.cache_dir={tmp_path / "cache"}',
      ],
    )

  def work(*a, **k):
    raise AssertionError('work started')

  monkeypatch.setattr(evaluation, 'embed_episodes', work)
  monkeypatch.setattr(evaluation, 'evaluate', work)
  with pytest.raises(EngramError, match=r'lacks 419 of 419 item ids \(e\.g\. conv-26/D1:1, conv-26/D1:2, ') as e:
    evaluate.run(cfg, tmp_path / 'run')
  assert '\n' not in str(e.value)
