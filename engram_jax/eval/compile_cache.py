"""A JAX persistent compilation cache that concurrent jobs can share: entries are only ever published whole.

JAX (0.10) writes a cache entry in place (``LRUCache.put``: ``path.write_bytes``, no lock without a size cap), so a
job reading a shared folder while another writes can meet a partial entry (JAX then warns and recompiles), and a
job killed mid-write leaves a truncated entry that is never rewritten. Here each process points JAX at a private
staging folder inside the shared one (:func:`stage`): it starts with hard links to every published entry (a link to
a whole file is whole), JAX reads and writes there, and after each job and at exit (:func:`publish`) every new
entry is copied into the shared folder through a temporary file and ``os.replace`` (atomic on POSIX): the shared
folder only ever holds whole entries, and two jobs publishing the same key leave one whole entry (equal content:
same key, same program). Publishing after each job (``remove=False``) matters where workers never run exit handlers
(Ray's): a worker killed after its job has already published it. :func:`stage` removes the staging folders of
processes of this host that are gone (the folder's name holds the host and pid) and any older than a day.

A damaged entry (a compressed stream cut short: a job killed while an older version wrote in place, a disk fault)
would be read, warned about and recompiled by every run, and never replaced (JAX does not overwrite an entry that
exists). :func:`stage` reads each entry it has not read whole before (:func:`entry_whole`; the ones read whole are
listed, by size and mtime, in ``.verified.json``), removes a damaged one from the shared folder (one warning) and does
not link it: the run compiles that program again and publishes it whole.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import shutil
import socket
import tempfile
import time
import zlib
from pathlib import Path

from engram_jax.data.embed import atomic_write

log = logging.getLogger(__name__)

ENTRY_GLOB = '*-cache'  # JAX's entry files (jax/_src/lru_cache.py: f'{key}-cache')
STAGE_PREFIX = '.stage-'
STALE_S = 24 * 3600
VERIFIED = '.verified.json'  # entry name -> [size, mtime_ns] of the entries read whole (stage)
ZSTD_MAGIC = b'\x28\xb5\x2f\xfd'


def _zstd_decompress():
  """A zstd decompressor (Python 3.14's compression.zstd, else the zstandard package), or None."""
  try:
    from compression import zstd  # type: ignore[import-not-found]

    return zstd.decompress
  except ImportError:
    pass
  try:
    import zstandard  # type: ignore[import-not-found]

    return lambda data: zstandard.ZstdDecompressor().decompress(data)
  except ImportError:
    return None


def entry_whole(data: bytes) -> bool | None:
  """Whether a cache entry's bytes are one whole compressed stream (JAX compresses each entry with zstd, or zlib
  without a zstd package): True, False (cut short or corrupt) or None (neither format, or zstd without a
  decompressor: not judged, kept).

  Example:
    >>> import zlib
    >>> data = zlib.compress(b'program' * 100)
    >>> entry_whole(data), entry_whole(data[:-9]), entry_whole(b'AAAA')
    (True, False, None)
  """
  if data[:4] == ZSTD_MAGIC:
    decompress = _zstd_decompress()
    if decompress is None:
      return None
    try:
      decompress(data)
    except Exception:  # noqa: BLE001 (each package raises its own error type for a damaged frame)
      return False
    return True
  if len(data) < 2 or data[0] & 0x0F != 8 or (data[0] << 8 | data[1]) % 31:  # not a zlib header (RFC 1950)
    return None
  d = zlib.decompressobj()
  try:
    d.decompress(data)
  except zlib.error:
    return False
  return d.eof


def _verified(shared: Path) -> dict[str, list[int]]:
  try:
    record = json.loads((shared / VERIFIED).read_text())
  except (OSError, ValueError):
    return {}
  return record if isinstance(record, dict) else {}


def _check_entries(shared: Path) -> list[Path]:
  """The whole (or unjudged) entries of ``shared``; a damaged one is removed from it (logged once)."""
  record = _verified(shared)
  kept, bad, known = [], [], {}
  for entry in shared.glob(ENTRY_GLOB):
    try:
      st = entry.stat()
      stamp = [st.st_size, st.st_mtime_ns]
      whole = True if record.get(entry.name) == stamp else entry_whole(entry.read_bytes())
    except FileNotFoundError:
      continue
    if whole is False:
      try:
        if entry.stat().st_mtime_ns == stamp[1]:  # not replaced by another process meanwhile
          entry.unlink()
          bad.append(entry.name)
      except FileNotFoundError:
        pass
      continue
    if whole:
      known[entry.name] = stamp
    kept.append(entry)
  if bad:
    log.warning(
      'compilation cache %s: removed %d damaged entr%s (a compressed stream cut short: %s); this run compiles '
      'their programs again and publishes them whole',
      shared,
      len(bad),
      'y' if len(bad) == 1 else 'ies',
      ', '.join(sorted(bad)[:3]) + (', ...' if len(bad) > 3 else ''),
    )
  if known != record and known:
    atomic_write(shared / VERIFIED, lambda f: f.write(json.dumps(known, sort_keys=True).encode()))
  return kept


def stage(shared: str | os.PathLike) -> Path:
  """A new private staging folder in ``shared`` holding hard links (copies where links fail) to its entries; a
  damaged entry is removed from ``shared`` instead (:func:`entry_whole`)."""
  shared = Path(shared)
  shared.mkdir(parents=True, exist_ok=True)
  now = time.time()
  host = socket.gethostname().replace('-', '_')
  for old in shared.glob(f'{STAGE_PREFIX}*'):
    try:
      if now - old.stat().st_mtime > STALE_S or _owner_gone(old.name, host):
        shutil.rmtree(old, ignore_errors=True)
    except FileNotFoundError:
      pass
  private = Path(tempfile.mkdtemp(prefix=f'{STAGE_PREFIX}{host}-{os.getpid()}-', dir=shared))
  for entry in _check_entries(shared):
    try:
      os.link(entry, private / entry.name)
    except FileNotFoundError:
      continue
    except OSError:
      shutil.copyfile(entry, private / entry.name)
  return private


def _owner_gone(name: str, host: str) -> bool:
  """True when staging folder ``name`` (``.stage-<host>-<pid>-...``) belongs to a process of ``host`` that no
  longer exists."""
  parts = name[len(STAGE_PREFIX) :].split('-')
  if len(parts) < 3 or parts[0] != host or not parts[1].isdigit():
    return False
  try:
    os.kill(int(parts[1]), 0)
  except ProcessLookupError:
    return True
  except PermissionError:
    return False
  return False


def _entries(folder: Path) -> list[str]:
  """Names of the entry files (:data:`ENTRY_GLOB`) directly in ``folder`` ([] when it does not exist)."""
  try:
    with os.scandir(folder) as it:
      return [e.name for e in it if fnmatch.fnmatchcase(e.name, ENTRY_GLOB)]
  except FileNotFoundError:
    return []


def publish(private: str | os.PathLike, shared: str | os.PathLike, *, remove: bool = True) -> list[str]:
  """Copy every entry of ``private`` that ``shared`` lacks into it atomically, then (``remove``) delete
  ``private``; returns the names published. ``remove=False`` publishes a job's entries and keeps staging (the
  process goes on)."""
  private, shared = Path(private), Path(shared)
  done = []
  present = set(_entries(shared))  # one listing of each folder (a job's call: ~1 ms for hundreds of entries)
  for name in sorted(set(_entries(private)) - present):
    target = shared / name
    if target.exists():  # published by another process since the listing
      continue
    data = (private / name).read_bytes()
    atomic_write(target, lambda f, data=data: f.write(data))
    done.append(name)
  if remove:
    shutil.rmtree(private, ignore_errors=True)
  return done
