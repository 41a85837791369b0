"""Embedding cache: keyed by the encoder spec, warm cache never re-embeds, bad shards rebuilt, bad vectors rejected."""

import json
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from engram_jax.data import embed

CONF = str(Path(__file__).resolve().parents[2] / 'conf')


class Counting:
  """A spec-less encoder (as callers may inject) that counts what it encodes."""

  def __init__(self, dim=32):
    self.calls, self.texts = 0, 0
    self.inner = embed.hashing_encoder(dim)

  def __call__(self, texts):
    self.calls += 1
    self.texts += len(texts)
    return self.inner(texts) * 3.0  # not unit-norm on purpose: embed_texts normalises


class Fake:
  """An encoder that carries a spec (as a sentence-transformers one would) but never loads a model."""

  def __init__(self, spec, vecs=None):
    self.spec, self.texts = spec, 0
    self.inner = embed.hashing_encoder(spec['dim'], seed=7)
    self.vecs = vecs

  def __call__(self, texts):
    self.texts += len(texts)
    return self.inner(texts) if self.vecs is None else self.vecs(texts)


def _no_sentence_transformers(monkeypatch):
  """Replace the sentence_transformers module by one whose model constructor raises."""

  def boom(*args, **kwargs):
    raise AssertionError('SentenceTransformer must not be constructed')

  monkeypatch.setitem(sys.modules, 'sentence_transformers', types.SimpleNamespace(SentenceTransformer=boom))


def _shards(root):
  return sorted(Path(root).rglob('shard-*.npz'))


def test_cache_warm_never_reembeds_and_dedups(tmp_path):
  enc = Counting()
  texts = ['a b', 'c', 'a b', 'd e f']
  v1 = embed.embed_texts(texts, cache_dir=tmp_path, model_id='m', encoder=enc, shard_size=2, progress=False)
  assert enc.texts == 3 and v1.dtype == np.float32
  np.testing.assert_allclose(np.linalg.norm(v1, axis=1), 1.0, rtol=1e-6)
  np.testing.assert_array_equal(v1[0], v1[2])
  v2 = embed.embed_texts(texts, cache_dir=tmp_path, model_id='m', encoder=enc, progress=False)
  assert enc.texts == 3
  np.testing.assert_array_equal(v1, v2)
  embed.embed_texts(['new'] + texts, cache_dir=tmp_path, model_id='m', encoder=enc, progress=False)
  assert enc.texts == 4
  embed.embed_texts(texts, cache_dir=tmp_path, model_id='other', encoder=enc, progress=False)
  assert enc.texts == 7  # keyed by model id too


def test_corrupt_shard_is_detected_and_rebuilt(tmp_path):
  enc = Counting()
  texts = ['x', 'y', 'z']
  v1 = embed.embed_texts(texts, cache_dir=tmp_path, model_id='m', encoder=enc, shard_size=2, progress=False)
  shards = _shards(tmp_path)
  assert len(shards) == 2
  with np.load(shards[0]) as z:
    n_lost = len(z['keys'])
  shards[0].write_bytes(b'garbage')
  cache = embed.EmbeddingCache(tmp_path, 'm')
  cache.load()
  assert cache.rebuilt == [shards[0].name] and 'not an .npz archive' in cache.problems[0]
  v2 = embed.embed_texts(texts, cache_dir=tmp_path, model_id='m', encoder=enc, progress=False)
  assert enc.texts == 3 + n_lost
  np.testing.assert_allclose(v1, v2)


def test_nan_vectors_rejected(tmp_path):
  with pytest.raises(ValueError, match='NaN'):
    embed.embed_texts(
      ['a'], cache_dir=tmp_path, model_id='m', encoder=lambda t: np.full((len(t), 4), np.nan), progress=False
    )


def test_other_hashing_dim_under_same_model_id_is_not_reused(tmp_path):
  texts = ['a dog barks', 'the cat', 'a dog barks', '']
  v256 = embed.embed_texts(
    texts, cache_dir=tmp_path, model_id='hashing', encoder=embed.hashing_encoder(256), progress=False
  )
  assert v256.shape == (4, 256)
  v64 = embed.embed_texts(
    texts, cache_dir=tmp_path, model_id='hashing', encoder=embed.hashing_encoder(64), progress=False
  )
  assert v64.shape == (4, 64) and v64.dtype == np.float32
  np.testing.assert_allclose(v64, embed.hashing_encoder(64)(texts), atol=1e-6)
  assert len({p.parent for p in _shards(tmp_path)}) == 2  # one folder per spec


def test_half_warm_cache_at_another_dim(tmp_path):
  old, new = ['one two', 'three'], ['four five', 'six']
  embed.embed_texts(old, cache_dir=tmp_path, model_id='hashing', encoder=embed.hashing_encoder(256), progress=False)
  texts = new + old + new
  v = embed.embed_texts(
    texts, cache_dir=tmp_path, model_id='hashing', encoder=embed.hashing_encoder(64), progress=False
  )
  np.testing.assert_allclose(v, embed.hashing_encoder(64)(texts), atol=1e-6)
  again = embed.embed_texts(
    old, cache_dir=tmp_path, model_id='hashing', encoder=embed.hashing_encoder(256), progress=False
  )  # the default run still works on its own cache
  np.testing.assert_allclose(again, embed.hashing_encoder(256)(old), atol=1e-6)


def test_other_model_path_under_same_model_id_gets_its_own_folder(tmp_path):
  base = {'kind': 'sentence-transformers', 'dim': 8, 'pooling': 'mean', 'max_seq_length': 256}
  a = Fake({**base, 'model': '/models/a', 'fingerprint': 'aaaa'})
  b = Fake({**base, 'model': '/models/b', 'fingerprint': 'bbbb'})
  texts = ['p', 'q r']
  embed.embed_texts(texts, cache_dir=tmp_path / 'c', model_id='st', encoder=a, progress=False)
  embed.embed_texts(texts, cache_dir=tmp_path / 'c', model_id='st', encoder=b, progress=False)
  assert (a.texts, b.texts) == (2, 2)
  folders = sorted({p.parent for p in _shards(tmp_path / 'c')})
  assert len(folders) == 2 and all(f.name.startswith('st-') for f in folders)
  specs = [json.loads((f / 'spec.json').read_text()) for f in folders]
  assert sorted(s['model'] for s in specs) == ['/models/a', '/models/b']
  embed.embed_texts(texts, cache_dir=tmp_path / 'c', model_id='st', encoder=a, progress=False)
  assert a.texts == 2  # its own cache is warm


def _tamper(shard, how):
  with np.load(shard, allow_pickle=False) as z:
    data = {k: z[k] for k in z.files}
  vecs = data['vecs']
  if how == 'scaled':
    vecs = vecs.copy()
    vecs[0] *= 2.0
  elif how == 'nan':
    vecs = vecs.copy()
    vecs[1, 0] = np.nan
  elif how == 'float64':
    vecs = vecs.astype(np.float64)
    vecs[0] = -vecs[0]  # another vector, still unit-norm: only the dtype gives it away
  elif how == 'wrong_dim':
    vecs = vecs[:, :16] + 0.1
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
  data['vecs'] = vecs
  np.savez(shard, **data)


@pytest.mark.parametrize('how,redone', [('scaled', 1), ('nan', 1), ('float64', 3), ('wrong_dim', 3)])
def test_bad_entries_are_reported_and_rebuilt_never_returned(tmp_path, how, redone):
  enc = Fake({'kind': 'test', 'dim': 32})
  texts = ['alpha beta', 'gamma', 'delta epsilon zeta']
  want = embed.embed_texts(texts, cache_dir=tmp_path, model_id='m', encoder=enc, progress=False)
  (shard,) = _shards(tmp_path)
  _tamper(shard, how)
  got, report = embed.embed_with_report(texts, cache_dir=tmp_path, model_id='m', encoder=enc, progress=False)
  np.testing.assert_allclose(got, want, atol=1e-6)
  assert got.dtype == np.float32
  assert report.rebuilt == [shard.name] and report.dropped == redone and len(report.problems) == 1
  assert enc.texts == 3 + redone and report.embedded == redone and report.cached == 3 - redone
  assert report.as_dict()['rebuilt'] == [shard.name]
  again, report = embed.embed_with_report(texts, cache_dir=tmp_path, model_id='m', encoder=enc, progress=False)
  np.testing.assert_array_equal(again, got)
  assert report.rebuilt == [] and enc.texts == 3 + redone  # the bad shard is gone; nothing re-embedded now


def test_shard_of_another_dim_in_a_spec_less_folder_never_reaches_stack(tmp_path):
  embed.embed_texts(['a', 'b'], cache_dir=tmp_path, model_id='m', encoder=Counting(32), progress=False)
  with pytest.raises(ValueError, match=r"'m'.*16.*32|'m'.*32.*16"):
    embed.embed_texts(['a', 'c'], cache_dir=tmp_path, model_id='m', encoder=Counting(16), progress=False)


def test_encoder_output_of_wrong_dim_is_a_clear_error(tmp_path):
  enc = Fake({'kind': 'test', 'model': '/models/x', 'dim': 8}, vecs=lambda t: np.ones((len(t), 12), np.float32))
  with pytest.raises(ValueError, match=r"'st'.*12.*8"):
    embed.embed_texts(['a'], cache_dir=tmp_path, model_id='st', encoder=enc, progress=False)
  assert _shards(tmp_path) == []


def test_hashing_spec_and_its_cache_folder(tmp_path):
  enc = embed.hashing_encoder(64, seed=3)
  assert enc.spec['dim'] == 64 and enc.spec['seed'] == 3 and 'tokenizer' in enc.spec
  assert json.loads(json.dumps(enc.spec)) == enc.spec
  assert embed.spec_hash(enc.spec) != embed.spec_hash(embed.hashing_encoder(64, seed=4).spec)
  embed.embed_texts(['x'], cache_dir=tmp_path, model_id='h', encoder=enc, progress=False)
  folder = tmp_path / f'h-{embed.spec_hash(enc.spec)[:12]}'
  assert json.loads((folder / 'spec.json').read_text()) == enc.spec
  assert not list(tmp_path.rglob('*.tmp'))


def test_minilm_spec_without_loading_the_model(monkeypatch):
  _no_sentence_transformers(monkeypatch)
  enc = embed.sentence_transformer_encoder()
  spec = enc.spec
  assert spec['dim'] == 384 and spec['max_seq_length'] == 256 and spec['normalize'] is True
  assert spec['pooling']['mode'] == ['mean']
  assert spec['model'] == Path(embed.resolve_model_path(embed.DEFAULT_MODEL)).name  # no absolute path
  assert len(spec['fingerprint']) == 64
  assert set(spec['versions']) >= {'sentence-transformers', 'transformers', 'torch'}
  assert json.loads(json.dumps(spec)) == spec
  assert embed.sentence_transformer_encoder(batch_size=8).spec == spec  # batch size does not key the cache


def test_minilm_spec_imports_neither_sentence_transformers_nor_torch():
  code = (
    'import sys; from engram_jax.data import embed; s = embed.sentence_transformer_encoder().spec; '
    'assert s["dim"] == 384; bad = {"sentence_transformers", "torch", "transformers"} & set(sys.modules); '
    'assert not bad, bad'
  )
  subprocess.run([sys.executable, '-c', code], check=True, cwd=Path(__file__).resolve().parents[2])


def test_local_model_folders_differ_by_content(tmp_path, monkeypatch):
  _no_sentence_transformers(monkeypatch)
  src = Path(embed.resolve_model_path(embed.DEFAULT_MODEL))
  folders = []
  for name, hidden in [('a', 384), ('b', 384), ('c', 64)]:
    f = tmp_path / name
    (f / '1_Pooling').mkdir(parents=True)
    for rel in ['modules.json', 'sentence_bert_config.json', '1_Pooling/config.json']:
      (f / rel).write_text((src / rel).read_text())
    config = json.loads((src / 'config.json').read_text())
    (f / 'config.json').write_text(json.dumps({**config, 'hidden_size': hidden}))
    pooling = json.loads((src / '1_Pooling/config.json').read_text())
    (f / '1_Pooling/config.json').write_text(json.dumps({**pooling, 'word_embedding_dimension': hidden}))
    (f / 'model.safetensors').write_bytes(name.encode() * 100)
    folders.append(f)
  specs = [embed.sentence_transformer_encoder('local', path=str(f)).spec for f in folders]
  assert [s['dim'] for s in specs] == [384, 384, 64]
  assert len({s['fingerprint'] for s in specs}) == 3
  assert len({embed.spec_hash(s) for s in specs}) == 3
  texts = ['u v', 'w']
  fakes = [Fake(s) for s in specs]
  for f in fakes:
    embed.embed_texts(texts, cache_dir=tmp_path / 'cache', model_id='local', encoder=f, progress=False)
  assert [f.texts for f in fakes] == [2, 2, 2]
  assert len({p.parent for p in _shards(tmp_path / 'cache')}) == 3


def test_warm_default_cache_never_constructs_the_model(tmp_path, monkeypatch):
  _no_sentence_transformers(monkeypatch)
  spec = embed.sentence_transformer_encoder().spec
  texts = ['I adopted a dog last week.', 'The invoice is overdue.']
  want = embed.embed_texts(texts, cache_dir=tmp_path, encoder=Fake(spec), progress=False)
  for enc in (None, embed.sentence_transformer_encoder()):
    got = embed.embed_texts(texts, cache_dir=tmp_path, encoder=enc, progress=False)
    np.testing.assert_array_equal(got, want)
  torch = embed.sentence_transformer_encoder(backend='torch')  # auto may pick an exported backend, which loads no model
  with pytest.raises(AssertionError, match='must not be constructed'):
    embed.embed_texts(['a new text'], cache_dir=tmp_path, encoder=torch, progress=False)  # cold: this one must load


def test_hydra_overrides_key_the_cache():
  from hydra import compose, initialize_config_dir
  from hydra.utils import instantiate

  with initialize_config_dir(config_dir=CONF, version_base='1.3'):
    cfg = compose(config_name='config', overrides=['embedder=hashing', 'embedder.encoder.dim=64'])
    st = compose(config_name='config', overrides=['embedder=minilm', 'embedder.encoder.path=/some/folder'])
  assert cfg.embedder.model_id == 'hashing-64'
  assert instantiate(cfg.embedder.encoder).spec['dim'] == 64
  enc = instantiate(st.embedder.encoder)
  assert enc.path == '/some/folder' and st.embedder.model_id == 'all-MiniLM-L6-v2'


@pytest.mark.slow
def test_real_minilm_from_the_wheel(tmp_path):
  enc = embed.sentence_transformer_encoder()
  v = embed.embed_texts(
    ['I adopted a dog last week.', 'We got a puppy recently.', 'The invoice is overdue.'],
    cache_dir=tmp_path,
    encoder=enc,
    progress=False,
  )
  assert v.shape == (3, 384)
  assert v[0] @ v[1] > v[0] @ v[2] + 0.2
  assert embed.resolve_model_path('all-MiniLM-L6-v2').endswith('model')


def test_interrupted_write_leaves_no_partial_shard(tmp_path, monkeypatch):
  enc = embed.hashing_encoder(8)
  embed.embed_texts(['a'], cache_dir=tmp_path, model_id='h', encoder=enc, progress=False)

  def crash(f, **arrays):
    f.write(b'PK partial')
    raise KeyboardInterrupt

  monkeypatch.setattr(embed.np, 'savez', crash)
  with pytest.raises(KeyboardInterrupt):
    embed.embed_texts(['b'], cache_dir=tmp_path, model_id='h', encoder=enc, progress=False)
  monkeypatch.undo()
  assert len(_shards(tmp_path)) == 1 and not list(tmp_path.rglob('*.tmp'))
  _, report = embed.embed_with_report(['a', 'b'], cache_dir=tmp_path, model_id='h', encoder=enc, progress=False)
  assert report.rebuilt == [] and (report.cached, report.embedded) == (1, 1)
