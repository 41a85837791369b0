"""Encoder backends: a sentence-transformers model run by torch, ONNX Runtime or OpenVINO, with the same vectors.

``torch`` is ``SentenceTransformer.encode`` itself. ``onnx`` and ``openvino`` run the model's Transformer module
exported once from its folder (``torch.onnx.export``, opset ``ONNX_OPSET``; ``openvino.convert_model`` of the same
torch module, weights kept in float32), and do the rest as sentence-transformers does: texts sorted by length
(longest first) and batched, tokenised by the folder's tokenizer (padding to the batch's longest, truncation at
``max_seq_length``), pooled over the attention mask (``mean`` or ``cls``, the Pooling module's config) and
normalised to unit length. Their float32 vectors equal torch's to float rounding (docs/performance.md#encoding).

An export is a folder ``<export_dir>/<model>-<backend>-<key[:16]>/`` (``model.onnx``, or ``model.xml`` +
``model.bin``, and ``export.json``), the key a sha256 of the model folder's fingerprint
(:func:`~engram_jax.data.embed.folder_fingerprint`), the backend, its package's version and torch's: made once,
in a hidden folder beside it and renamed into place under a file lock (a concurrent job waits, then reads it).

``precision='bf16'`` (OpenVINO only, opt-in) sets OpenVINO's inference precision hint to bfloat16: other vectors
(lowest cosine to float32's about 0.9998), so it keys the cache apart. ``'f32'`` sets the hint to float32 explicitly:
on CPUs with bfloat16 instructions OpenVINO's own default is bfloat16.

Example:
  >>> from engram_jax.data.backends import BACKENDS, resolve_backend
  >>> BACKENDS
  ('torch', 'onnx', 'openvino')
  >>> resolve_backend('torch')
  'torch'
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import filelock
import numpy as np

from engram_jax.core.errors import EngramError

BACKENDS = ('torch', 'onnx', 'openvino')
PRECISIONS = ('f32', 'bf16')
AUTO = 'auto'
# what 'auto' picks, first installed; torch when none is. ONNX Runtime is not among them: on a quiet 2-core Xeon it
# ran MiniLM at 0.85x torch's rate (docs/performance.md#encoding), so it runs only when asked for
AUTO_ORDER = ('openvino',)
PACKAGES = {'torch': ('torch', 'sentence_transformers'), 'onnx': ('onnxruntime', 'onnx'), 'openvino': ('openvino',)}
DISTRIBUTIONS = {'onnx': 'onnxruntime', 'openvino': 'openvino'}  # the package whose version keys the vectors
INSTALL = {
  'torch': "pip install -c requirements/lock.txt -e '.[embed]'",
  'onnx': "pip install -c requirements/lock.txt -e '.[embed,onnx]'",
  'openvino': "pip install -c requirements/lock.txt -e '.[embed,openvino]'",
}
ONNX_OPSET = 17
EXPORT_FORMAT = 1  # bump when what an export holds changes: every export key changes with it
POOLING = ('mean', 'cls')
Runner = Callable[[np.ndarray, np.ndarray], np.ndarray]


def _findable(package: str) -> bool:
  try:
    return importlib.util.find_spec(package) is not None
  except ValueError:  # imported without a spec (a stand-in module): it is there
    return True


def installed(backend: str) -> bool:
  """Whether every package ``backend`` needs is importable (looked up, not imported)."""
  return all(_findable(p) for p in PACKAGES[backend])


def resolve_backend(backend: str, *, precision: str = 'f32', device: str = 'cpu', processes: int = 1) -> str:
  """The backend to run: ``backend`` itself, checked; ``'auto'``: the first installed of ``AUTO_ORDER`` on one
  CPU process in float32, else ``torch``.

  Raises:
    EngramError: one line, on an unknown backend or precision, a backend whose packages are not installed
      (with the install command), a device or pool it cannot run on, or bf16 on a backend without it.
  """
  if backend not in (*BACKENDS, AUTO):
    raise EngramError(f'embedder: unknown backend {backend!r}; backends: {[*BACKENDS, AUTO]}')
  if precision not in PRECISIONS:
    raise EngramError(f'embedder: unknown precision {precision!r}; precisions: {list(PRECISIONS)}')
  if backend == AUTO:
    if precision != 'f32':
      return resolve_backend('openvino', precision=precision, device=device, processes=processes)
    if str(device).split(':', 1)[0] != 'cpu' or processes > 1:
      return 'torch'
    return next((b for b in AUTO_ORDER if installed(b)), 'torch')
  if not installed(backend):
    missing = [p for p in PACKAGES[backend] if not _findable(p)]
    raise EngramError(f'embedder backend {backend!r} needs {", ".join(missing)}, not installed: {INSTALL[backend]}')
  if backend != 'torch' and (str(device).split(':', 1)[0] != 'cpu' or processes > 1):
    raise EngramError(
      f'embedder backend {backend!r} runs in this process on the CPU (device {device!r}, processes {processes} '
      'asked): use backend torch'
    )
  if precision != 'f32' and backend != 'openvino':
    raise EngramError(f'embedder: precision {precision!r} needs backend openvino (got {backend!r})')
  return backend


def backend_version(backend: str) -> str | None:
  """``major.minor`` of the runtime package of ``backend`` (``None`` for torch: the spec's versions have it)."""
  if backend not in DISTRIBUTIONS:
    return None
  try:
    return '.'.join(importlib.metadata.version(DISTRIBUTIONS[backend]).split('+')[0].split('.')[:2])
  except importlib.metadata.PackageNotFoundError:
    return None


def backend_spec(backend: str, precision: str = 'f32') -> dict[str, Any]:
  """What the backend adds to an encoder's spec (the cache key): nothing for torch (today's keys stay valid),
  else ``{'backend': {'name', 'version', 'precision'[, 'opset']}}``."""
  if backend == 'torch':
    return {}
  entry: dict[str, Any] = {'name': backend, 'version': backend_version(backend), 'precision': precision}
  if backend == 'onnx':
    entry['opset'] = ONNX_OPSET
  return {'backend': entry}


# ----------------------------------------------------------------------------------------------
# The model folder's modules


@dataclasses.dataclass(frozen=True)
class Layout:
  """What the exported backends need from a sentence-transformers folder (read from its config files).

  Attributes:
    transformer: the Transformer module's folder (tokenizer and weights).
    max_seq_length: truncation length (``None``: the tokenizer's own).
    pooling: the Pooling module's single mode (``mean`` or ``cls``).
  """

  transformer: Path
  max_seq_length: int | None
  pooling: str


def _read_json(path: Path) -> Any:
  try:
    return json.loads(path.read_text(encoding='utf-8'))
  except FileNotFoundError:
    return None


def model_layout(folder: str | os.PathLike, spec: Mapping[str, Any], backend: str) -> Layout:
  """The :class:`Layout` of the model in ``folder`` whose spec is ``spec``.

  Raises:
    EngramError: one line when the model has a module these backends do not run (Dense, an unknown one), a
      pooling mode other than mean or cls, prompts excluded from pooling, or lower-casing done outside its
      tokenizer: use backend torch.
  """
  folder = Path(folder)
  modules = _read_json(folder / 'modules.json') or [{'idx': 0, 'path': '', 'type': 'Transformer'}]
  kinds = {str(m.get('type', '')).rsplit('.', 1)[-1]: m for m in modules}
  extra = sorted(set(kinds) - {'Transformer', 'Pooling', 'Normalize'})
  pooling = spec.get('pooling') or {'mode': ['mean'], 'include_prompt': True}
  problem = None
  if 'Transformer' not in kinds:
    problem = f'no Transformer module among {sorted(kinds)}'
  elif extra:
    problem = f'modules {extra}'
  elif len(pooling['mode']) != 1 or pooling['mode'][0] not in POOLING:
    problem = f'pooling {pooling["mode"]}'
  elif not pooling.get('include_prompt', True):
    problem = 'pooling without the prompt (include_prompt: false)'
  elif spec.get('do_lower_case'):
    problem = 'do_lower_case'
  if problem is not None:
    raise EngramError(f'embedder backend {backend!r} cannot run {folder.name} ({problem}): use backend torch')
  return Layout(folder / kinds['Transformer'].get('path', ''), spec.get('max_seq_length'), pooling['mode'][0])


# ----------------------------------------------------------------------------------------------
# Export


def export_key(fingerprint: str, backend: str) -> str:
  """sha256 (hex) of what an export depends on: the model folder's fingerprint, the backend and its package's
  full version, torch's version (the exporter) and the opset."""
  versions = {p: _version(p) for p in ('torch', DISTRIBUTIONS[backend])}
  text = json.dumps(
    {
      'format': EXPORT_FORMAT,
      'fingerprint': fingerprint,
      'backend': backend,
      'opset': ONNX_OPSET,
      'versions': versions,
    },
    sort_keys=True,
  )
  return hashlib.sha256(text.encode()).hexdigest()


def _version(package: str) -> str | None:
  try:
    return importlib.metadata.version(package)
  except importlib.metadata.PackageNotFoundError:
    return None


def export_folder(export_dir: str | os.PathLike, name: str, fingerprint: str, backend: str) -> Path:
  """Where the ``backend`` export of model ``name`` (folder fingerprint ``fingerprint``) lives."""
  return Path(export_dir) / f'{name}-{backend}-{export_key(fingerprint, backend)[:16]}'


def _model_file(backend: str) -> str:
  return 'model.onnx' if backend == 'onnx' else 'model.xml'


def _hidden_states_module(transformer: Path) -> Any:
  """The folder's transformer as a torch module ``(input_ids [B, L], attention_mask [B, L]) -> [B, L, H]``."""
  import torch
  import transformers

  inner = transformers.AutoModel.from_pretrained(str(transformer)).eval()

  class HiddenStates(torch.nn.Module):
    def __init__(self, model: Any):
      super().__init__()
      self.model = model

    def forward(self, input_ids: Any, attention_mask: Any) -> Any:
      return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

  return HiddenStates(inner).eval()


def _example(transformer: Path) -> dict[str, Any]:
  import transformers

  tok = transformers.AutoTokenizer.from_pretrained(str(transformer))
  feats = tok(['a short example text', 'another'], padding=True, return_tensors='pt')
  return {'input_ids': feats['input_ids'], 'attention_mask': feats['attention_mask']}


def write_export(layout: Layout, backend: str, into: Path) -> None:
  """Export the Transformer module of ``layout`` for ``backend`` into folder ``into`` (float32 weights)."""
  import torch

  module, example = _hidden_states_module(layout.transformer), _example(layout.transformer)
  with torch.no_grad():
    if backend == 'onnx':
      torch.onnx.export(
        module,
        (example['input_ids'], example['attention_mask']),
        str(into / 'model.onnx'),
        input_names=['input_ids', 'attention_mask'],
        output_names=['hidden'],
        dynamic_axes={'input_ids': {0: 'batch', 1: 'seq'}, 'attention_mask': {0: 'batch', 1: 'seq'}},
        opset_version=ONNX_OPSET,
        dynamo=False,
      )
    else:
      import openvino as ov

      ov.save_model(ov.convert_model(module, example_input=example), str(into / 'model.xml'), compress_to_fp16=False)


def ensure_export(
  layout: Layout,
  backend: str,
  *,
  name: str,
  fingerprint: str,
  export_dir: str | os.PathLike,
  log: Callable[[str], None] | None = None,
) -> Path:
  """The model file of the ``backend`` export (``model.onnx`` or ``model.xml``), made on first use (see the module
  docstring); later calls, in any process, find it and export nothing."""
  target = export_folder(export_dir, name, fingerprint, backend)
  path = target / _model_file(backend)
  if path.is_file():
    return path
  target.parent.mkdir(parents=True, exist_ok=True)
  with filelock.FileLock(target.parent / f'.{target.name}.lock'):
    if path.is_file():  # exported by a concurrent job while this one waited
      return path
    if log is not None:
      log(f'embedder {name}: exporting for {backend} into {target} (once)')
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f'.{target.name}.'))
    try:
      os.chmod(tmp, 0o755)
      write_export(layout, backend, tmp)
      info = {'model': name, 'fingerprint': fingerprint, 'backend': backend, 'key': export_key(fingerprint, backend)}
      (tmp / 'export.json').write_text(json.dumps(info, indent=1) + '\n')
      os.replace(tmp, target)
    except BaseException:
      shutil.rmtree(tmp, ignore_errors=True)
      raise
  return path


# ----------------------------------------------------------------------------------------------
# Running an export


def _cpus() -> int:
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # not on Linux
    return os.cpu_count() or 1


def onnx_runner(path: Path, *, threads: int | None = None) -> Runner:
  """``(input_ids [B, L], attention_mask [B, L]) -> [B, L, H]`` float32 through an ONNX Runtime CPU session."""
  import onnxruntime as ort

  opts = ort.SessionOptions()
  opts.intra_op_num_threads = threads or _cpus()
  opts.inter_op_num_threads = 1
  session = ort.InferenceSession(str(path), opts, providers=['CPUExecutionProvider'])
  return lambda ids, mask: session.run(None, {'input_ids': ids, 'attention_mask': mask})[0]


def openvino_runner(path: Path, *, precision: str = 'f32', threads: int | None = None) -> Runner:
  """``(input_ids [B, L], attention_mask [B, L]) -> [B, L, H]`` float32 through OpenVINO on the CPU, at inference
  precision ``precision`` (``f32`` or ``bf16``; set explicitly, since OpenVINO's default follows the CPU)."""
  import openvino as ov

  config = {
    'INFERENCE_PRECISION_HINT': precision,
    'PERFORMANCE_HINT': 'LATENCY',
    'INFERENCE_NUM_THREADS': threads or _cpus(),
  }
  request = ov.Core().compile_model(str(path), 'CPU', config).create_infer_request()
  return lambda ids, mask: np.asarray(request.infer({'input_ids': ids, 'attention_mask': mask})[0], np.float32).copy()


def pool_tokens(hidden: np.ndarray, mask: np.ndarray, mode: str) -> np.ndarray:
  r"""Token states to one unit-norm vector per text, as sentence-transformers' Pooling and Normalize modules.

  ``mean``: :math:`\sum_t m_t h_t / \max(\sum_t m_t, 10^{-9})`; ``cls``: the first token's state. Then each row is
  divided by :math:`\max(\|v\|, 10^{-12})`.

  Args:
    hidden: ``[B, L, H]`` token states.
    mask: ``[B, L]`` attention mask (1 for real tokens).
    mode: ``'mean'`` or ``'cls'``.

  Returns:
    ``[B, H]`` float32.

  >>> h = np.array([[[3.0, 4.0], [9.0, 9.0]]], np.float32)
  >>> pool_tokens(h, np.array([[1, 0]]), 'mean').tolist()
  [[0.6000000238418579, 0.800000011920929]]
  """
  if mode == 'cls':
    pooled = hidden[:, 0]
  else:
    m = mask[..., None].astype(np.float32)
    pooled = (hidden * m).sum(1) / np.maximum(m.sum(1), 1e-9)
  return (pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)).astype(np.float32)


def length_batches(texts: Sequence[str], batch_size: int) -> list[np.ndarray]:
  """Indices of ``texts`` in batches of ``batch_size``, longest texts (in characters) first, as
  ``SentenceTransformer.encode`` orders them (``np.argsort`` of minus the length)."""
  order = np.argsort([-len(t) for t in texts])
  return [order[s : s + batch_size] for s in range(0, len(texts), batch_size)]


@dataclasses.dataclass(frozen=True, eq=False)
class ExportedEncoder:
  """``(texts, prompt) -> [T, D]`` float32 unit-norm through an export: :func:`length_batches`, the folder's
  tokenizer, ``runner``, :func:`pool_tokens`."""

  layout: Layout
  runner: Runner
  batch_size: int = 64

  @functools.cached_property
  def tokenizer(self) -> Any:
    import transformers

    return transformers.AutoTokenizer.from_pretrained(str(self.layout.transformer))

  def tokenize(self, texts: list[str]) -> dict[str, np.ndarray]:
    """``input_ids`` and ``attention_mask``, both ``[B, L]`` int64, padded to the batch's longest."""
    max_length = self.layout.max_seq_length or self.tokenizer.model_max_length
    feats = self.tokenizer(texts, padding=True, truncation=True, max_length=max_length, return_tensors='np')
    return {k: np.asarray(feats[k], np.int64) for k in ('input_ids', 'attention_mask')}

  def encode(self, texts: Sequence[str], prompt: str = '') -> np.ndarray:
    texts = [prompt + t for t in texts]
    out: np.ndarray | None = None
    for idx in length_batches(texts, self.batch_size):
      feats = self.tokenize([texts[i] for i in idx])
      vecs = pool_tokens(
        self.runner(feats['input_ids'], feats['attention_mask']), feats['attention_mask'], self.layout.pooling
      )
      if out is None:
        out = np.zeros((len(texts), vecs.shape[1]), np.float32)
      out[idx] = vecs
    return out if out is not None else np.zeros((0, 0), np.float32)


def exported_encoder(
  folder: str | os.PathLike,
  spec: Mapping[str, Any],
  backend: str,
  *,
  precision: str = 'f32',
  batch_size: int = 64,
  export_dir: str | os.PathLike,
  threads: int | None = None,
  name: str | None = None,
  log: Callable[[str], None] | None = None,
) -> ExportedEncoder:
  """The :class:`ExportedEncoder` of the model in ``folder`` (spec ``spec``) on ``backend`` (``onnx`` or
  ``openvino``), exporting it first when ``export_dir`` has no export of it yet (``name``: the export folder's
  label, default the model folder's name)."""
  layout = model_layout(folder, spec, backend)
  path = ensure_export(
    layout, backend, name=name or Path(folder).name, fingerprint=spec['fingerprint'], export_dir=export_dir, log=log
  )
  if backend == 'onnx':
    runner = onnx_runner(path, threads=threads)
  else:
    runner = openvino_runner(path, precision=precision, threads=threads)
  return ExportedEncoder(layout, runner, int(batch_size))
