"""The encoding bench (experiments.bench.encode): FLOP counts from a model config, the table, the CLI's checks, and a
real MiniLM run (slow; needs LoCoMo and the embed extra, as CI has)."""

import importlib.util

import pytest

from engram_jax.data import backends, io
from experiments.bench import cli, common, encode

MINILM = {'num_hidden_layers': 6, 'hidden_size': 384, 'intermediate_size': 1536}
MPNET = {'num_hidden_layers': 12, 'hidden_size': 768, 'intermediate_size': 3072}


def test_matmul_parameters_and_flops_by_hand():
  # per layer: Q, K, V, output (4 h^2) and the two FFN matrices (2 h i)
  assert encode.matmul_params_per_token(MINILM) == 6 * (4 * 384**2 + 2 * 384 * 1536) == 10_616_832
  assert encode.matmul_params_per_token(MPNET) == 12 * (4 * 768**2 + 2 * 768 * 3072) == 84_934_656
  # a 10-token and a 1-token text: 2 * params * tokens + 4 * layers * h * n^2 (QK^T and AV)
  want = 2 * 84_934_656 * 11 + 4 * 12 * 768 * (100 + 1)
  assert encode.text_flops(MPNET, [10, 1]) == want


def _row(path, tps, **kw):
  return {'model': 'mpnet', 'path': path, 'texts': 10, 'tokens': 300, 'seconds': [10 / tps], 'texts_per_s': tps, **kw}


def test_table_gives_rates_ratios_and_unavailable_paths():
  result = {
    'rows': [
      _row('torch', 10.0, gflops=50.0, ratio=1.0, max_abs_diff=0.0, min_cosine=1.0),
      _row('onnx', 20.0, gflops=100.0, ratio=2.0, max_abs_diff=3e-7, min_cosine=0.9999999, texts_per_cpu_s=12.5),
      {'model': 'mpnet', 'path': 'onnx_int8', 'texts': 10, 'tokens': 300, 'unavailable': 'unavailable: needs x'},
    ],
    'matmul_gflops': [200.0, 190.0, 210.0],
    'threads': 2,
    'texts': 10,
  }
  table = encode.format_encode(result)
  assert 'matmul rate (2048^3, same rounds): 200 GFLOP/s' in table
  assert '| mpnet | onnx | 20.0 (20.0-20.0) | 12.5 | 100 | 50% | 2.00 | 3.0e-07 | 1.000000 |' in table
  assert '| mpnet | onnx_int8 | unavailable: needs x |' in table


def test_cli_refuses_unknown_models_and_paths(capsys):
  with pytest.raises(SystemExit):
    cli.main(['--encode', '--encode-models', 'bert'])
  assert "unknown --encode-models/--encode-paths ['bert']" in capsys.readouterr().err
  with pytest.raises(SystemExit):
    cli.main(['--encode', '--encode-paths', 'torch,fp16'])
  assert "['fp16']" in capsys.readouterr().err


def test_backend_paths_say_what_they_need_when_missing(monkeypatch):
  monkeypatch.setattr(backends, 'installed', lambda backend: False)
  paths = encode.build_paths(object(), None, ['onnx', 'onnx_int8', 'openvino', 'openvino_bf16'], '.cache')
  assert paths['onnx'].startswith('unavailable: needs onnxruntime and onnx')
  assert paths['openvino_bf16'].startswith('unavailable: needs openvino (pip install')


def test_every_bench_prints_the_cpu_and_its_vector_instructions():
  name, flags = common.cpu_model('processor\t: 0\nmodel name\t: Xeon X\nflags\t\t: fpu avx2 avx512_bf16 amx_tile\n')
  assert (name, flags) == ('Xeon X', ['avx2', 'avx512_bf16', 'amx_tile'])
  assert common.environment()[0].startswith('cpu: ')


def _have_locomo() -> bool:
  try:
    return (io.resolve_data_root() / 'locomo' / 'locomo10.json').is_file()
  except Exception:
    return False


@pytest.mark.slow
@pytest.mark.skipif(not _have_locomo(), reason='LoCoMo not found under the data root')
@pytest.mark.skipif(importlib.util.find_spec('sentence_transformers') is None, reason='needs the embed extra')
def test_minilm_torch_paths_agree_and_are_timed(tmp_path):
  texts = encode.sample_texts(12)
  assert len(set(texts)) == 12 and texts == encode.sample_texts(12)  # seeded
  result = encode.time_encoders(
    ['minilm'],
    [
      'torch',
      'torch_b128',
      'torch_1thread',
      'torch_unsorted',
      *[p for p in ('onnx', 'openvino') if backends.installed(p)],
    ],
    texts,
    rounds=2,
    cache_dir=str(tmp_path),
  )
  rows = {r['path']: r for r in result['rows']}
  assert rows['torch']['ratio'] == 1.0 and rows['torch']['max_abs_diff'] == 0.0
  for r in rows.values():
    assert len(r['seconds']) == 2 and r['texts_per_s'] > 0 and r['gflops'] > 0 and r['texts_per_cpu_s'] > 0
    assert r['max_abs_diff'] < 1e-5 and r['min_cosine'] > 0.99999  # same model, batches padded differently
  assert len(result['matmul_gflops']) == 2 and '| minilm | torch |' in encode.format_encode(result)
