"""Encoding speed: texts/s and GFLOP/s of the sentence-transformers embedders against the cores' matmul rate, for
today's path and each option, interleaved rounds, with each option's vectors compared to today's.

    python -m experiments.bench --encode                                   # MiniLM and mpnet, the backends
    python -m experiments.bench --encode --encode-models mpnet --encode-paths torch,torch_int8 --rounds 3

Texts: a seeded sample of LoCoMo's distinct item and question texts (``--encode-texts``, the same sample for every
path and model). A round times every (model, path) once, in a fixed order; the table gives the median over rounds
with min-max, texts per CPU-second (the process's CPU time, all its threads: what a shared machine pays) and the
lowest cosine of each path's vectors to today's. Paths (``PATHS``; ``DEFAULT_PATHS`` unless ``--encode-paths``):

* ``torch``: today's path, ``SentenceTransformer.encode(batch_size=64, normalize_embeddings=True)`` with torch's
  default threads (one per core). sentence-transformers already sorts the texts by length before batching (length
  bucketing), so a batch is padded to about its own length.
* ``torch_b16`` / ``torch_b128``: the same with batch size 16 / 128.
* ``torch_1thread``: the same on one torch thread (``torch.set_num_threads(1)`` for the call, restored after).
* ``torch_unsorted``: batches of 64 in the texts' given order, each its own ``encode`` call: what length
  bucketing saves.
* ``torch_int8``: dynamic int8 quantisation of every ``nn.Linear`` (``torch.ao.quantization.quantize_dynamic``):
  other vectors, so never a silent default.
* ``onnx``, ``openvino``, ``openvino_bf16``: the embedder's backends (:mod:`engram_jax.data.backends`, exactly
  what ``embedder.encoder.backend=...`` runs): the transformer exported once under ``--cache-dir``/exports and run
  by ONNX Runtime or OpenVINO (float32; ``_bf16``: OpenVINO's bfloat16 inference precision), tokenised, sorted,
  batched, pooled and normalised as ``encode`` does.
* ``onnx_int8``: the ONNX export dynamically quantised to int8 by ``onnxruntime.quantization.quantize_dynamic``.

sentence-transformers' own ``backend='onnx'``/``'openvino'`` need ``optimum``, whose releases require
``transformers<4.58`` (the lock has 5.x): it cannot be installed beside the tested set, hence the direct export. The
ONNX paths need the ``onnx`` extra, the OpenVINO ones the ``openvino`` extra; without them they are listed as
unavailable.

FLOPs: ``2 * (matmul parameters per token) * tokens + 4 * layers * hidden * n^2`` per text of ``n`` tokens (the
weight matmuls of every layer, ``4 h^2 + 2 h i``, and attention's two ``n x n`` products), real tokens only (the
padding is work the path chose to do). The matmul rate is a float32 ``[2048, 2048] @ [2048, 2048]`` in torch on the
same threads, timed in the same rounds: a measured ceiling under the same load, not the chip's datasheet peak.
"""

from __future__ import annotations

import copy
import os
import random
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

PATHS = (
  'torch',
  'onnx',
  'openvino',
  'openvino_bf16',
  'torch_b16',
  'torch_b128',
  'torch_1thread',
  'torch_unsorted',
  'torch_int8',
  'onnx_int8',
)
DEFAULT_PATHS = ('torch', 'onnx', 'openvino', 'openvino_bf16')
BACKEND_PATHS = {
  'onnx': ('onnx', 'f32'),
  'openvino': ('openvino', 'f32'),
  'openvino_bf16': ('openvino', 'bf16'),
  'onnx_int8': ('onnx', 'f32'),
}
MODELS = ('minilm', 'mpnet')
BASE = 'torch'


def matmul_params_per_token(config: Mapping[str, Any]) -> int:
  """Weights a token passes through in matmuls: ``layers * (4 h^2 + 2 h i)`` (Q, K, V, output; the two FFN
  matrices) from a transformers config (``num_hidden_layers``, ``hidden_size``, ``intermediate_size``).

  >>> matmul_params_per_token({'num_hidden_layers': 6, 'hidden_size': 384, 'intermediate_size': 1536})
  10616832
  """
  layers, h, i = config['num_hidden_layers'], config['hidden_size'], config['intermediate_size']
  return layers * (4 * h * h + 2 * h * i)


def text_flops(config: Mapping[str, Any], lengths: Sequence[int]) -> float:
  """FLOPs of encoding texts of ``lengths`` tokens: ``2 * params * n + 4 * layers * h * n^2`` each."""
  n = np.asarray(lengths, np.float64)
  p = matmul_params_per_token(config)
  return float((2 * p * n + 4 * config['num_hidden_layers'] * config['hidden_size'] * n**2).sum())


def sample_texts(n: int, root: str | None = None, seed: int = 0) -> list[str]:
  """``n`` distinct LoCoMo item and question texts, drawn with ``seed`` (all of them when ``n`` is 0)."""
  from engram_jax.data.locomo import load_locomo

  episodes, _ = load_locomo(root)
  texts = sorted({t for ep in episodes for t in [*(it.text for it in ep.items), *(q.text for q in ep.questions)]})
  random.Random(seed).shuffle(texts)
  return texts if not n else texts[:n]


def load_model(name: str, cache_dir: str) -> tuple[Any, Path]:
  """The SentenceTransformer of ``minilm`` (the bundled MiniLM) or ``mpnet`` (the packaged one), on the CPU, and its
  folder."""
  from sentence_transformers import SentenceTransformer

  from engram_jax.data import embed, packaged

  if name == 'minilm':
    folder = embed.resolve_model_path(embed.DEFAULT_MODEL)
  elif name == 'mpnet':
    folder = packaged.packaged_model_folder(packaged.MPNET, cache_dir)
  else:
    raise ValueError(f'unknown model {name!r}; models: {list(MODELS)}')
  os.environ.setdefault('HF_HUB_OFFLINE', '1')
  return SentenceTransformer(str(folder), device='cpu'), Path(folder)


def _st_encode(model: Any, texts: list[str], batch_size: int = 64) -> np.ndarray:
  return model.encode(
    texts, batch_size=batch_size, convert_to_numpy=True, normalize_embeddings=True, show_progress_bar=False
  ).astype(np.float32)


def _with_threads(n: int, fn: Callable[[], np.ndarray]) -> np.ndarray:
  import torch

  before = torch.get_num_threads()
  torch.set_num_threads(n)
  try:
    return fn()
  finally:
    torch.set_num_threads(before)


def onnx_int8(path: Path) -> Path:
  """``path`` dynamically quantised to int8 weights (``onnxruntime.quantization.quantize_dynamic``, per channel,
  7-bit range: of the settings tried on mpnet, the one whose vectors stay closest to float32's), once."""
  from onnxruntime.quantization import QuantType, quantize_dynamic

  out = path.with_name(path.stem + '-int8pc.onnx')
  if not out.is_file():
    tmp = out.with_name(f'.{out.name}.{os.getpid()}.tmp')
    quantize_dynamic(str(path), str(tmp), weight_type=QuantType.QInt8, per_channel=True, reduce_range=True)
    os.replace(tmp, out)
  return out


def backend_path(name: str, folder: Path, cache_dir: str) -> Callable[[list[str]], np.ndarray] | str:
  """Path ``name`` of ``BACKEND_PATHS`` for the model in ``folder`` (``texts -> vectors``), or why it is
  unavailable."""
  from engram_jax.data import backends, embed

  backend, precision = BACKEND_PATHS[name]
  if not backends.installed(backend):
    return f'unavailable: needs {" and ".join(backends.PACKAGES[backend])} ({backends.INSTALL[backend]})'
  spec = embed.sentence_transformer_spec(folder)
  exports = Path(cache_dir) / 'exports'
  if name != 'onnx_int8':
    enc = backends.exported_encoder(folder, spec, backend, precision=precision, export_dir=exports)
    return enc.encode
  layout = backends.model_layout(folder, spec, backend)
  path = backends.ensure_export(layout, backend, name=folder.name, fingerprint=spec['fingerprint'], export_dir=exports)
  return backends.ExportedEncoder(layout, backends.onnx_runner(onnx_int8(path))).encode


def build_paths(
  model: Any, folder: Path, names: Sequence[str], cache_dir: str
) -> dict[str, Callable[[list[str]], np.ndarray] | str]:
  """Each named path of ``model`` (loaded from ``folder``) as ``texts -> vectors``, or why it is unavailable."""
  import torch

  out: dict[str, Any] = {}
  for name in names:
    if name == 'torch':
      out[name] = lambda t: _st_encode(model, t)
    elif name == 'torch_b16':
      out[name] = lambda t: _st_encode(model, t, 16)
    elif name == 'torch_b128':
      out[name] = lambda t: _st_encode(model, t, 128)
    elif name == 'torch_1thread':
      out[name] = lambda t: _with_threads(1, lambda: _st_encode(model, t))
    elif name == 'torch_unsorted':
      out[name] = lambda t: np.concatenate([_st_encode(model, t[s : s + 64]) for s in range(0, len(t), 64)])
    elif name == 'torch_int8':
      q = torch.ao.quantization.quantize_dynamic(copy.deepcopy(model), {torch.nn.Linear}, dtype=torch.qint8)
      out[name] = lambda t, q=q: _st_encode(q, t)
    elif name in BACKEND_PATHS:
      out[name] = backend_path(name, folder, cache_dir)
    else:
      raise ValueError(f'unknown path {name!r}; paths: {list(PATHS)}')
  return out


def matmul_rate(n: int = 2048, repeats: int = 3) -> float:
  """GFLOP/s of a float32 ``[n, n] @ [n, n]`` in torch on its current threads (best of ``repeats``)."""
  import torch

  a, b = torch.randn(n, n), torch.randn(n, n)
  a @ b
  best = float('inf')
  for _ in range(repeats):
    t = time.perf_counter()
    a @ b
    best = min(best, time.perf_counter() - t)
  return 2 * n**3 / best / 1e9


def time_encoders(
  models: Sequence[str],
  paths: Sequence[str],
  texts: list[str],
  *,
  rounds: int,
  cache_dir: str,
  log: Callable[[str], None] = lambda s: None,
) -> dict[str, Any]:
  """Time every (model, path) on ``texts``, ``rounds`` interleaved rounds; returns rows and the matmul rates.

  A row: model, path, ``seconds`` and ``cpu_seconds`` (process CPU time) per round, ``texts_per_s``,
  ``texts_per_cpu_s`` and ``gflops`` (medians), ``ratio`` (texts/s over
  today's ``torch`` path of the same model), ``max_abs_diff`` of its vectors from today's and the lowest cosine
  between the two vectors of one text, or ``unavailable`` with the reason.
  """
  import torch

  setups = {}
  for m in models:
    log(f'loading {m}')
    st, folder = load_model(m, cache_dir)
    config = st[0].auto_model.config.to_dict()
    lengths = [min(len(ids), st.max_seq_length) for ids in st.tokenizer(texts)['input_ids']]
    setups[m] = (
      st,
      config,
      text_flops(config, lengths),
      build_paths(st, folder, paths, cache_dir),
      int(np.sum(lengths)),
    )
  times: dict[tuple[str, str], list[float]] = {}
  cpu: dict[tuple[str, str], list[float]] = {}
  vecs: dict[tuple[str, str], np.ndarray] = {}
  rates = []
  for r in range(rounds):
    rates.append(matmul_rate())
    for m in models:
      for p, fn in setups[m][3].items():
        if isinstance(fn, str):
          continue
        if r == 0:
          fn(texts[:8])  # warm-up (allocation, ONNX Runtime's first run)
        t, c = time.perf_counter(), time.process_time()
        v = fn(texts)
        times.setdefault((m, p), []).append(time.perf_counter() - t)
        cpu.setdefault((m, p), []).append(time.process_time() - c)
        vecs[(m, p)] = v
        log(f'round {r}: {m} {p} {len(texts) / times[(m, p)][-1]:.1f} texts/s')
  rows = []
  for m in models:
    st, config, flops, fns, tokens = setups[m]
    base = np.median(times[(m, BASE)]) if (m, BASE) in times else None
    for p, fn in fns.items():
      row: dict[str, Any] = {'model': m, 'path': p, 'texts': len(texts), 'tokens': tokens}
      if isinstance(fn, str):
        rows.append({**row, 'unavailable': fn})
        continue
      sec = float(np.median(times[(m, p)]))
      row.update(seconds=times[(m, p)], texts_per_s=len(texts) / sec, gflops=flops / sec / 1e9)
      row.update(cpu_seconds=cpu[(m, p)], texts_per_cpu_s=len(texts) / float(np.median(cpu[(m, p)])))
      row['ratio'] = base / sec if base else None
      if (m, BASE) in vecs:
        a, b = vecs[(m, BASE)].astype(np.float64), vecs[(m, p)].astype(np.float64)
        row['max_abs_diff'] = float(np.abs(a - b).max())
        row['min_cosine'] = float((a * b).sum(1).min())
      rows.append(row)
  return {'rows': rows, 'matmul_gflops': rates, 'threads': torch.get_num_threads(), 'texts': len(texts)}


def format_encode(result: Mapping[str, Any]) -> str:
  """The Markdown table of :func:`time_encoders`."""
  peak = float(np.median(result['matmul_gflops']))
  lines = [
    f'{result["texts"]} LoCoMo texts; torch threads {result["threads"]}; float32 matmul rate (2048^3, same rounds): '
    f'{peak:.0f} GFLOP/s (median; {min(result["matmul_gflops"]):.0f}-{max(result["matmul_gflops"]):.0f})',
    '',
    '| model | path | texts/s (min-max) | texts per CPU-s | GFLOP/s | of matmul rate | ratio to torch | max abs diff '
    '| min cosine |',
    '|---|---|---|---|---|---|---|---|---|',
  ]
  for r in result['rows']:
    if 'unavailable' in r:
      lines.append(f'| {r["model"]} | {r["path"]} | {r["unavailable"]} | | | | | | |')
      continue
    per_cpu = f'{r["texts_per_cpu_s"]:.1f}' if 'texts_per_cpu_s' in r else 'n/a'
    tps = [r['texts'] / s for s in r['seconds']]
    diff = f'{r["max_abs_diff"]:.1e}' if 'max_abs_diff' in r else 'n/a'
    cos = f'{r["min_cosine"]:.6f}' if 'min_cosine' in r else 'n/a'
    ratio = f'{r["ratio"]:.2f}' if r.get('ratio') else 'n/a'
    lines.append(
      f'| {r["model"]} | {r["path"]} | {r["texts_per_s"]:.1f} ({min(tps):.1f}-{max(tps):.1f}) | {per_cpu} | '
      f'{r["gflops"]:.0f} | '
      f'{r["gflops"] / peak:.0%} | {ratio} | {diff} | {cos} |'
    )
  return '\n'.join(lines)
