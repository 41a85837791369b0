"""Files written whole or not at all: :func:`atomic_write` (the embedding cache, run folders, exports).

In the core so that the run folder (:mod:`engram_jax.core.runfolder`) and the data layer share it without the core
importing the data layer.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO


def _umask() -> int:
  mask = os.umask(0o022)
  os.umask(mask)
  return mask


UMASK = _umask()


def atomic_write(path: Path, write: Callable[[IO[bytes]], None]) -> None:
  """Write ``path`` through a hidden temporary file in the same folder, flushed to disk, then ``os.replace``
  (atomic on POSIX, also on NFS): a reader sees the old file or the whole new one, never a part; a crash leaves
  at most a stray ``.*.tmp``. The file gets the usual ``0666 & ~umask`` mode (a group-shared cache stays readable),
  not ``mkstemp``'s 0600."""
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f'.{path.name}.', suffix='.tmp')
  try:
    with os.fdopen(fd, 'wb') as f:
      if hasattr(os, 'fchmod'):
        os.fchmod(f.fileno(), 0o666 & ~UMASK)
      write(f)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    Path(tmp).unlink(missing_ok=True)
    raise
