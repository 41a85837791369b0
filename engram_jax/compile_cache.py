"""A JAX persistent compilation cache that concurrent jobs can share: entries are only ever published whole.

JAX (0.10) writes a cache entry in place (``LRUCache.put``: ``path.write_bytes``, no lock without a size cap), so a
job reading a shared folder while another writes can meet a partial entry (JAX then warns and recompiles), and a
job killed mid-write leaves a truncated entry that is never rewritten. Here each process points JAX at a private
staging folder inside the shared one (:func:`stage`): it starts with hard links to every published entry (a link to
a whole file is whole), JAX reads and writes there, and at exit (:func:`publish`) every new entry is copied into the
shared folder through a temporary file and ``os.replace`` (atomic on POSIX): the shared folder only ever holds
whole entries, and two jobs publishing the same key leave one whole entry (equal content: same key, same program).
A killed job's staging folder is never published; :func:`stage` removes staging folders older than a day.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from engram_jax.embed import atomic_write

ENTRY_GLOB = '*-cache'     # JAX's entry files (jax/_src/lru_cache.py: f'{key}-cache')
STAGE_PREFIX = '.stage-'
STALE_S = 24 * 3600


def stage(shared: str | os.PathLike) -> Path:
  """A new private staging folder in ``shared`` holding hard links (copies where links fail) to its entries."""
  shared = Path(shared)
  shared.mkdir(parents=True, exist_ok=True)
  now = time.time()
  for old in shared.glob(f'{STAGE_PREFIX}*'):
    try:
      if now - old.stat().st_mtime > STALE_S:
        shutil.rmtree(old, ignore_errors=True)
    except FileNotFoundError:
      pass
  private = Path(tempfile.mkdtemp(prefix=STAGE_PREFIX, dir=shared))
  for entry in shared.glob(ENTRY_GLOB):
    try:
      os.link(entry, private / entry.name)
    except FileNotFoundError:
      continue
    except OSError:
      shutil.copyfile(entry, private / entry.name)
  return private


def publish(private: str | os.PathLike, shared: str | os.PathLike) -> list[str]:
  """Copy every entry of ``private`` that ``shared`` lacks into it atomically, then delete ``private``; returns
  the names published."""
  private, shared = Path(private), Path(shared)
  done = []
  for entry in sorted(private.glob(ENTRY_GLOB)):
    target = shared / entry.name
    if target.exists():
      continue
    data = entry.read_bytes()
    atomic_write(target, lambda f, data=data: f.write(data))
    done.append(entry.name)
  shutil.rmtree(private, ignore_errors=True)
  return done
