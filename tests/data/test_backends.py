"""Encoder backends: option parsing, missing packages, cache keys per backend, torch's vectors reproduced, exports
made once."""

import importlib.util

import numpy as np
import pytest

from engram_jax.core.errors import EngramError
from engram_jax.data import backends, embed

HAVE_ONNX = backends.installed('onnx')
HAVE_OPENVINO = backends.installed('openvino')
TEXTS = ['a dog barks at the mailman', 'Invoice #42 is due on Friday.', 'ok', 'Caroline went to the LGBTQ group.']


def _without(monkeypatch, *packages):
  """Make ``packages`` look uninstalled to the backend checks."""
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, 'find_spec', lambda name, *a: None if name in packages else real(name, *a))


def test_resolve_backend_names():
  assert backends.resolve_backend('torch') == 'torch'
  assert backends.resolve_backend('auto', processes=2) == 'torch'  # a pool is torch's
  assert backends.resolve_backend('auto', device='cuda:0') == 'torch'
  with pytest.raises(EngramError, match='unknown backend'):
    backends.resolve_backend('tensorrt')
  with pytest.raises(EngramError, match='unknown precision'):
    backends.resolve_backend('torch', precision='int8')
  with pytest.raises(EngramError, match='needs backend openvino'):
    backends.resolve_backend('torch', precision='bf16')


def test_auto_picks_openvino_where_installed_else_torch(monkeypatch):
  _without(monkeypatch, 'openvino', 'onnxruntime')
  assert backends.resolve_backend('auto') == 'torch'
  monkeypatch.undo()
  _without(monkeypatch, 'openvino')
  assert backends.resolve_backend('auto') == 'torch'  # ONNX Runtime only when asked for (slower than torch here)
  monkeypatch.undo()
  if backends.installed('openvino'):
    assert backends.resolve_backend('auto') == 'openvino'


def test_missing_package_is_one_line(monkeypatch):
  _without(monkeypatch, 'openvino')
  with pytest.raises(EngramError, match=r'needs openvino, not installed: pip install .*\[embed,openvino\]') as e:
    embed.sentence_transformer_encoder(backend='openvino')
  assert '\n' not in str(e.value)
  with pytest.raises(EngramError, match='needs openvino'):
    backends.resolve_backend('auto', precision='bf16')


@pytest.mark.skipif(not HAVE_ONNX, reason='onnxruntime and onnx not installed (the onnx extra)')
def test_exported_backends_run_on_one_cpu_process():
  with pytest.raises(EngramError, match='use backend torch'):
    embed.sentence_transformer_encoder(backend='onnx', processes=2)
  with pytest.raises(EngramError, match='use backend torch'):
    embed.sentence_transformer_encoder(backend='onnx', device='cuda')


def test_cache_key_differs_per_backend():
  specs = {
    (b, p): embed.SentenceTransformerEncoder(backend=b, precision=p).spec
    for b, p in [('torch', 'f32'), ('onnx', 'f32'), ('openvino', 'f32'), ('openvino', 'bf16')]
  }
  assert 'backend' not in specs['torch', 'f32']  # today's key: caches made before backends stay valid
  assert specs['openvino', 'bf16']['backend']['precision'] == 'bf16'
  assert len({embed.spec_hash(s) for s in specs.values()}) == len(specs)
  assert {k: v for k, v in specs['onnx', 'f32'].items() if k != 'backend'} == specs['torch', 'f32']


def test_a_fit_applies_across_float32_backends_not_to_bf16():
  """The cache keeps every backend apart, but a fit's encoder identity (what the road checks vectors against)
  leaves a float32 backend out: a fit made under OpenVINO applies to torch's vectors, not to bf16's."""
  from engram_jax.fit.apply import identity_sha256

  ids = {
    (b, p): identity_sha256(embed.SentenceTransformerEncoder(backend=b, precision=p).spec)
    for b, p in [('torch', 'f32'), ('onnx', 'f32'), ('openvino', 'f32'), ('openvino', 'bf16')]
  }
  assert ids['torch', 'f32'] == ids['onnx', 'f32'] == ids['openvino', 'f32'] != ids['openvino', 'bf16']
  assert ids['torch', 'f32'] == embed.spec_hash(embed.SentenceTransformerEncoder(backend='torch').spec)  # older fits


def test_the_class_takes_resolved_names_only():
  with pytest.raises(EngramError, match='resolve auto first'):
    embed.SentenceTransformerEncoder(backend='auto')


def test_layout_refuses_what_the_exports_do_not_run(tmp_path):
  spec = {'pooling': {'mode': ['mean'], 'include_prompt': True}, 'max_seq_length': 128, 'fingerprint': 'x'}
  assert backends.model_layout(tmp_path, spec, 'onnx') == backends.Layout(tmp_path, 128, 'mean')
  for bad in (
    {**spec, 'pooling': {'mode': ['max'], 'include_prompt': True}},
    {**spec, 'pooling': {'mode': ['mean'], 'include_prompt': False}},
    {**spec, 'do_lower_case': True},
  ):
    with pytest.raises(EngramError, match='use backend torch'):
      backends.model_layout(tmp_path, bad, 'onnx')
  (tmp_path / 'modules.json').write_text(
    '[{"idx": 0, "path": "", "type": "Transformer"}, {"idx": 1, "path": "1", "type": "Pooling"},'
    ' {"idx": 2, "path": "2", "type": "sentence_transformers.models.Dense"}]'
  )
  with pytest.raises(EngramError, match=r"modules \['Dense'\]"):
    backends.model_layout(tmp_path, spec, 'openvino')


def test_pooling_and_batches():
  hidden = np.arange(2 * 3 * 2, dtype=np.float32).reshape(2, 3, 2) + 1
  mask = np.array([[1, 1, 0], [1, 0, 0]])
  mean = backends.pool_tokens(hidden, mask, 'mean')
  want = np.array([[2.0, 3.0], [7.0, 8.0]])
  np.testing.assert_allclose(mean, want / np.linalg.norm(want, axis=1, keepdims=True), rtol=1e-6)
  cls = backends.pool_tokens(hidden, mask, 'cls')
  np.testing.assert_allclose(cls, hidden[:, 0] / np.linalg.norm(hidden[:, 0], axis=1, keepdims=True), rtol=1e-6)
  batches = backends.length_batches(['a', 'ccc', 'bb', 'dddd', 'e'], 2)
  assert batches[0].tolist() == [3, 1] and batches[1][0] == 2 and [len(b) for b in batches] == [2, 2, 1]
  assert sorted(np.concatenate(batches).tolist()) == list(range(5))


def _backend_params():
  return [
    pytest.param('onnx', 'f32', marks=pytest.mark.skipif(not HAVE_ONNX, reason='the onnx extra is not installed')),
    pytest.param(
      'openvino', 'f32', marks=pytest.mark.skipif(not HAVE_OPENVINO, reason='the openvino extra is not installed')
    ),
  ]


@pytest.mark.slow
@pytest.mark.parametrize('backend, precision', _backend_params())
def test_exported_minilm_reproduces_torch(backend, precision, tmp_path, monkeypatch):
  torch_vecs = embed.sentence_transformer_encoder(backend='torch', batch_size=2)(TEXTS)
  enc = embed.sentence_transformer_encoder(backend=backend, batch_size=2, export_dir=tmp_path)
  vecs = enc(TEXTS)
  assert vecs.dtype == np.float32 and vecs.shape == (len(TEXTS), 384)
  np.testing.assert_allclose(vecs, torch_vecs, atol=1e-5)
  prompted = embed.PromptedEncoder(enc, 'query: ')
  torch_prompted = embed.PromptedEncoder(embed.sentence_transformer_encoder(backend='torch'), 'query: ')
  np.testing.assert_allclose(prompted(TEXTS[:2]), torch_prompted(TEXTS[:2]), atol=1e-5)
  (export,) = [p for p in tmp_path.iterdir() if not p.name.startswith('.')]
  assert export.name.startswith(f'all-MiniLM-L6-v2-{backend}-')

  def no_export(*args, **kwargs):
    raise AssertionError('exported twice')

  monkeypatch.setattr(backends, 'write_export', no_export)  # a second encoder finds the export
  again = embed.sentence_transformer_encoder(backend=backend, batch_size=2, export_dir=tmp_path)
  np.testing.assert_array_equal(again(TEXTS), vecs)


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_OPENVINO, reason='the openvino extra is not installed')
def test_openvino_bf16_is_close_and_keyed_apart(tmp_path):
  f32 = embed.sentence_transformer_encoder(backend='openvino', export_dir=tmp_path)
  bf16 = embed.sentence_transformer_encoder(backend='openvino', precision='bf16', export_dir=tmp_path)
  a, b = f32(TEXTS), bf16(TEXTS)
  assert (a * b).sum(1).min() > 0.999
  assert embed.spec_hash(f32.spec) != embed.spec_hash(bf16.spec)
  assert len([p for p in tmp_path.iterdir() if not p.name.startswith('.')]) == 1  # one export, two precisions
