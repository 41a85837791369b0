"""A run folder is whole or marked: its outputs written aside and renamed, a completion marker written last.

A run (``experiments.evaluate``, ``experiments.fit``) writes its folder through a :class:`Run` (:func:`begin`):

1. :func:`begin` removes the old marker ``run_complete.json`` FIRST (before any other write), then every output
   this run will write (files, and folders such as ``artifact/``) that an earlier run left there. A rerun into a used
   folder clears rather than refuses: the docs' own commands rerun into fixed ``hydra.run.dir`` folders, and once
   the marker is gone no reader takes the old files for a run's, so removing them only keeps leftovers (an old
   ``artifact/adapter`` beside a new run's ``artifact/fitted``, an old ``final.safetensors``) out of the new run.
2. every file is written atomically (:func:`write_file`: a hidden temporary file in the same folder, flushed, then
   ``os.replace``; :func:`engram_jax.data.embed.atomic_write`), mode ``0644`` under the usual umask;
3. :meth:`Run.finish` writes the marker LAST: the run's id (a fresh uuid) and the sha256 of every file it vouches
   for (the run's outputs and Hydra's ``.hydra/*.yaml`` of the run, written before the run started).

Every reader calls :func:`check` (the folder and the files it reads) and gets one line (``EngramError``) for a folder
with no marker, a file the marker does not vouch for, or a file whose bytes differ from the marker's hash::

  incomplete or mixed run folder RUN: file fitted.json does not match run_complete.json (...)

so that a run killed mid-way, or a rerun that failed after Hydra rewrote ``.hydra/overrides.yaml``, is refused, never
read as a mix of two runs (SQLite's and orbax's commit: write aside, rename, mark last).

Fault injection: with ``ENGRAM_FAULT_AT=n`` the process kills itself (SIGKILL) just before the n-th step that
changes a run folder (a removal by :func:`begin`, a :func:`write_file`, the marker), counted from 1 in the process;
``ENGRAM_FAULT_LOG=PATH`` appends each step's number and path to PATH first (tests/probes/test_probe_folders.py).

Example:
  >>> import tempfile
  >>> from pathlib import Path
  >>> d = Path(tempfile.mkdtemp())
  >>> run = begin(d, ['results.json'])
  >>> _ = run.write('results.json', '{}')
  >>> sorted(run.finish()['files'])
  ['results.json']
  >>> check(d, ['results.json'])['run_id'] == json.loads((d / MARKER).read_text())['run_id']
  True
  >>> _ = (d / 'results.json').write_text('{"edited": 1}')
  >>> check(d, ['results.json'])
  Traceback (most recent call last):
  ...
  engram_jax.core.errors.EngramError: incomplete or mixed run folder ...: file results.json does not match ...
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import signal
import time
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from engram_jax.core.errors import EngramError
from engram_jax.data.embed import atomic_write

MARKER = 'run_complete.json'
FORMAT = 'engram_jax.run/1'
FAULT_ENV = 'ENGRAM_FAULT_AT'
FAULT_LOG_ENV = 'ENGRAM_FAULT_LOG'
HYDRA_FILES = ('.hydra/config.yaml', '.hydra/hydra.yaml', '.hydra/overrides.yaml')
# what makes a folder a run's (a reader of a file in such a folder checks the folder's marker)
RUN_SIGNS = (MARKER, 'results.json', 'results.md', 'config_resolved.yaml', '.hydra', 'artifact')

_steps = 0


def _step(path: Path) -> None:
  """One step that changes a run folder: the fault-injection hook (module docstring)."""
  global _steps
  _steps += 1
  log = os.environ.get(FAULT_LOG_ENV)
  if log:
    with open(log, 'a') as f:
      f.write(f'{_steps}\t{path}\n')
  at = os.environ.get(FAULT_ENV)
  if at and int(at) == _steps:
    os.kill(os.getpid(), signal.SIGKILL)


def write_file(path: Path | str, data: str | bytes) -> Path:
  """Write ``data`` (text as UTF-8) to ``path`` atomically (parents created; the old file or the whole new one,
  never a part), mode ``0666 & ~umask``. Returns ``path``."""
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  raw = data.encode('utf-8') if isinstance(data, str) else bytes(data)
  _step(path)
  atomic_write(path, lambda f: f.write(raw))
  return path


def sha256_file(path: Path | str) -> str:
  """sha256 (hex) of a file's bytes."""
  h = hashlib.sha256()
  with open(path, 'rb') as f:
    for chunk in iter(lambda: f.read(1 << 20), b''):
      h.update(chunk)
  return h.hexdigest()


def _files_under(folder: Path, name: str) -> list[str]:
  """``name`` (relative to ``folder``) if it is a file, else every file under it (no temporary ``.*.tmp``)."""
  path = folder / name
  if path.is_file():
    return [name]
  if not path.is_dir():
    return []
  return sorted(
    p.relative_to(folder).as_posix()
    for p in path.rglob('*')
    if p.is_file() and not (p.name.startswith('.') and p.name.endswith('.tmp'))
  )


@dataclasses.dataclass
class Run:
  """A run writing its folder (:func:`begin`): ``outputs`` are the names it writes (files or folders)."""

  folder: Path
  outputs: tuple[str, ...]
  run_id: str

  def write(self, name: str, data: str | bytes) -> Path:
    """Write output ``name`` (a path relative to the folder, inside one of ``outputs``) atomically."""
    top = Path(name).parts[0]
    if name not in self.outputs and top not in self.outputs:
      raise ValueError(f'{name} is not among the outputs {self.outputs} this run declared (runfolder.begin)')
    return write_file(self.folder / name, data)

  def write_files(self, files: dict[str, str | bytes]) -> None:
    """:meth:`write` each ``name -> text`` in order."""
    for name, data in files.items():
      self.write(name, data)

  def finish(self, info: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write the marker, last: the run's id, when, and the sha256 of every output present (each file of an output
    folder) and of Hydra's files of the run. Returns the marker."""
    names = [n for out in self.outputs for n in _files_under(self.folder, out)]
    names += [n for n in HYDRA_FILES if (self.folder / n).is_file()]
    marker = {
      'format': FORMAT,
      'run_id': self.run_id,
      'finished': time.strftime('%Y-%m-%dT%H:%M:%S%z'),
      'files': {n: sha256_file(self.folder / n) for n in sorted(set(names))},
      **dict(info or {}),
    }
    write_file(self.folder / MARKER, json.dumps(marker, indent=1) + '\n')
    return marker


def begin(folder: Path | str, outputs: Iterable[str]) -> Run:
  """Start a run into ``folder`` (created): remove the old marker first, then each of ``outputs`` an earlier run
  left (a file, or a folder with all it holds), so that a run killed at any point leaves a folder every reader
  refuses (module docstring: why clear rather than refuse). Returns the :class:`Run` that writes the folder."""
  folder = Path(folder)
  folder.mkdir(parents=True, exist_ok=True)
  marker = folder / MARKER
  if marker.exists() or marker.is_symlink():
    _step(marker)
    marker.unlink()
  outputs = tuple(dict.fromkeys(outputs))
  for name in outputs:
    path = folder / name
    if path.is_dir() and not path.is_symlink():
      _step(path)
      shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
      _step(path)
      path.unlink()
  return Run(folder, outputs, uuid.uuid4().hex)


def is_run_folder(folder: Path | str) -> bool:
  """True when ``folder`` holds a run's files (its marker, results, resolved config, ``.hydra`` or ``artifact``)."""
  folder = Path(folder)
  return folder.is_dir() and any((folder / s).exists() for s in RUN_SIGNS)


def run_folder_of(path: Path | str) -> Path | None:
  """The run folder that holds ``path`` (a run folder itself, a file in one, or an artifact folder
  ``RUN/artifact/<variant>``), else None (a standalone file or artifact folder)."""
  path = Path(path)
  if path.is_dir() and is_run_folder(path):
    return path
  if path.is_dir() and path.parent.name == 'artifact':
    return path.parent.parent
  if path.is_file() and is_run_folder(path.parent):
    return path.parent
  return None


def refuse(folder: Path | str, why: str) -> EngramError:
  """The one-line error of a folder that is not one whole run."""
  return EngramError(f'incomplete or mixed run folder {folder}: {why}')


def check(folder: Path | str, files: Sequence[str] = ()) -> dict[str, Any]:
  """The marker of the run in ``folder``, after checking that the run is whole: the marker is there, it vouches for
  each of ``files`` (relative paths: what the caller reads), and every file it vouches for has its recorded sha256.

  Raises:
    EngramError: one line, ``incomplete or mixed run folder FOLDER: ...`` naming the file.
  """
  folder = Path(folder)
  path = folder / MARKER
  if not path.is_file():
    raise refuse(
      folder,
      f'no {MARKER} (the run that wrote it did not finish: it failed, was killed, is still running, or predates '
      'run markers); rerun it',
    )
  try:
    marker = json.loads(path.read_text())
    vouched = dict(marker['files'])
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise refuse(folder, f'file {MARKER} is not readable ({type(e).__name__}: {e})') from None
  for name in files:
    if name not in vouched:
      raise refuse(
        folder, f'file {name} is not one of the files of the run that finished here (not in {MARKER}); rerun it'
      )
  for name, digest in vouched.items():
    target = folder / name
    if not target.is_file():
      raise refuse(folder, f'file {name} is missing (listed in {MARKER}); rerun it')
    if sha256_file(target) != digest:
      raise refuse(
        folder,
        f'file {name} does not match {MARKER} (written after the run finished: a later run into this folder '
        'failed or was killed, or the file was edited); rerun it',
      )
  return marker


def check_file(path: Path | str) -> None:
  """Before reading the file ``path``: when it lies in a run folder (:func:`run_folder_of`; also when it is missing
  there), that run must be whole and vouch for it (:func:`check`); a file outside any run folder is read as it is."""
  path = Path(path)
  run = run_folder_of(path) if path.is_file() else path.parent if is_run_folder(path.parent) else None
  if run is not None:
    check(run, [path.resolve().relative_to(run.resolve()).as_posix()])


def mark(folder: Path | str, outputs: Iterable[str]) -> dict[str, Any]:
  """Vouch for ``outputs`` as they are in ``folder`` now: write its marker (a run written by hand, e.g. a test's,
  or one written before run markers, once checked). Returns the marker."""
  return Run(Path(folder), tuple(outputs), uuid.uuid4().hex).finish()
