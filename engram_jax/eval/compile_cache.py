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
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

from engram_jax.data.embed import atomic_write

ENTRY_GLOB = '*-cache'  # JAX's entry files (jax/_src/lru_cache.py: f'{key}-cache')
STAGE_PREFIX = '.stage-'
STALE_S = 24 * 3600


def stage(shared: str | os.PathLike) -> Path:
  """A new private staging folder in ``shared`` holding hard links (copies where links fail) to its entries."""
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
  for entry in shared.glob(ENTRY_GLOB):
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
