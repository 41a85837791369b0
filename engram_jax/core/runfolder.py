"""A run folder is whole or marked: its outputs written aside and renamed, a completion marker written last.

A run (``experiments.evaluate``, ``experiments.fit``) writes its folder through a :class:`Run` (:func:`begin`):

0. one writer: :func:`begin` takes the folder's lock (``.run.lock``, ``flock``) for the run's life (released by
   :meth:`Run.finish`, by :meth:`Run.release` / leaving ``with run:``, and by the OS when the process exits or is
   killed, so a killed run's lock never blocks: its file is cleared by the next run). A second run into a folder in
   use is refused in one line naming the holder (its pid, host, start and command line)::

     run folder RUN is in use by another run (pid 4242 on host, since ...: python -m experiments.evaluate ...): ...

   and a file the caller knows to be its own (``expect``: Hydra's ``.hydra/overrides.yaml`` as this process's Hydra
   wrote it) that another run rewrote before the lock was taken refuses the run too. Hydra's files of the run are
   kept as they were at :func:`begin`: another process's Hydra rewriting them while this run holds the folder is
   undone at :meth:`Run.finish`.
1. :func:`begin` removes the old marker ``run_complete.json`` FIRST (before any other write), then every output
   this run will write (files, and folders such as ``artifact/``) that an earlier run left there. A rerun into a used
   folder clears rather than refuses: the docs' own commands rerun into fixed ``hydra.run.dir`` folders, and once
   the marker is gone no reader takes the old files for a run's, so removing them only keeps leftovers (an old
   ``artifact/adapter`` beside a new run's ``artifact/fitted``, an old ``final.safetensors``) out of the new run.
2. every file is written atomically (:func:`write_file`: a hidden temporary file in the same folder, flushed, then
   ``os.replace``; :func:`engram_jax.core.files.atomic_write`), mode ``0644`` under the usual umask;
3. :meth:`Run.finish` writes the marker LAST: the run's id (a fresh uuid) and the sha256 of every file it vouches
   for (the run's outputs and Hydra's ``.hydra/*.yaml`` of the run, written before the run started). It vouches only
   for this run's files: an output file the run did not write (through :func:`write_file` while it held the folder),
   or one whose bytes changed after the run wrote it, refuses the marker (one line; the folder stays unmarked).

Every reader calls :func:`check` (the folder and the files it reads) and gets one line (``EngramError``) for a folder
with no marker, a file the marker does not vouch for, or a file whose bytes differ from the marker's hash::

  incomplete or mixed run folder RUN: file fitted.json does not match run_complete.json (...)

so that a run killed mid-way, or a rerun that failed after Hydra rewrote ``.hydra/overrides.yaml``, is refused, never
read as a mix of two runs (SQLite's and orbax's commit: write aside, rename, mark last).

Fault injection: with ``ENGRAM_FAULT_AT=n`` the process kills itself (SIGKILL) just before the n-th step that
changes a run folder (a removal by :func:`begin`, a :func:`write_file`, the marker), counted from 1 in the process;
``ENGRAM_FAULT_LOG=PATH`` appends each step's number and path to PATH first (tests/probes/test_probe_folders.py).
``ENGRAM_FAULT_SNAPSHOT=FOLDER:DEST`` (``os.pathsep`` between) copies FOLDER to ``DEST/<n>`` (n zero-padded) just before every step
n, at the point where ``ENGRAM_FAULT_AT=n`` would kill: one run gives the folder a kill before each of its steps
would leave (the probe checks a few real kills against these copies).

Example:
  >>> import tempfile
  >>> from pathlib import Path
  >>> d = Path(tempfile.mkdtemp())
  >>> run = begin(d, ['results.json'])
  >>> begin(d, ['results.json'])
  Traceback (most recent call last):
  ...
  engram_jax.core.errors.EngramError: run folder ... is in use by another run (pid ...
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
import logging
import os
import shutil
import signal
import socket
import sys
import time
import uuid
import warnings
import weakref
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from engram_jax.core.errors import EngramError
from engram_jax.core.files import atomic_write

try:
  import fcntl
except ImportError:  # not POSIX: runs are not locked (one writer per folder is then up to the user)
  fcntl = None

log = logging.getLogger(__name__)

MARKER = 'run_complete.json'
LOCK = '.run.lock'
FORMAT = 'engram_jax.run/1'
FAULT_ENV = 'ENGRAM_FAULT_AT'
FAULT_LOG_ENV = 'ENGRAM_FAULT_LOG'
FAULT_SNAPSHOT_ENV = 'ENGRAM_FAULT_SNAPSHOT'
HYDRA_FILES = ('.hydra/config.yaml', '.hydra/hydra.yaml', '.hydra/overrides.yaml')
# what makes a folder a run's (a reader of a file in such a folder checks the folder's marker)
RUN_SIGNS = (MARKER, 'results.json', 'results.md', 'config_resolved.yaml', '.hydra', 'artifact')

_steps = 0
_active: weakref.WeakValueDictionary[Path, Run] = weakref.WeakValueDictionary()  # folder (resolved) -> its Run here


def _step(path: Path) -> None:
  """One step that changes a run folder: the fault-injection hook (module docstring)."""
  global _steps
  _steps += 1
  log = os.environ.get(FAULT_LOG_ENV)
  if log:
    with open(log, 'a') as f:
      f.write(f'{_steps}\t{path}\n')
  snapshot = os.environ.get(FAULT_SNAPSHOT_ENV)
  if snapshot:
    folder, dest = snapshot.split(os.pathsep, 1)
    shutil.copytree(folder, Path(dest) / f'{_steps:03d}', symlinks=True)
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
  if _active:  # a file of a run this process is writing: the run vouches for these bytes (Run.finish)
    full = path.resolve()
    for folder, run in list(_active.items()):
      if folder in full.parents:
        run.written[full.relative_to(folder).as_posix()] = hashlib.sha256(raw).hexdigest()
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


def _unlock(fd: int, path: str, owner: int) -> None:
  """Release a folder's lock: its file removed while still held (so that no one locks a file on its way out),
  then the descriptor closed (which releases ``flock``). A forked child that inherited it leaves both alone."""
  if os.getpid() != owner:
    return
  try:
    os.unlink(path)
  except OSError:
    pass
  try:
    os.close(fd)
  except OSError:
    pass


def _holder(raw: bytes) -> str:
  """The holder a lock file names (its pid, host, start and command line), as words for the refusal."""
  try:
    info = json.loads(raw.decode('utf-8'))
    pid, host = int(info['pid']), str(info.get('host', '?'))
  except (ValueError, KeyError, TypeError, UnicodeDecodeError):
    return 'holder unknown: it is starting'
  argv = ' '.join(map(str, info.get('argv') or [])).replace('\n', ' ')[:160]
  words = f'pid {pid} on {host}, since {info.get("since", "?")}: {argv}'
  if host == socket.gethostname() and pid == os.getpid():
    words += '; this process'
  elif host == socket.gethostname():
    try:
      os.kill(pid, 0)
    except ProcessLookupError:
      words += f'; pid {pid} is gone, a process it started still holds the lock'
    except OSError:
      pass
  return words


class FolderLock:
  """A run folder's lock (:data:`LOCK`, an exclusive ``flock``), held from :func:`begin` until :meth:`release`, the
  lock's collection, or the process's end (the OS releases a killed holder's ``flock``: a stale lock file is only
  overwritten). Raises EngramError (one line naming the holder) when another run holds it, in this or another
  process."""

  def __init__(self, folder: Path):
    self.path = folder / LOCK
    self.stale: str | None = None  # what a killed holder's lock file named, when this lock cleared one
    self._fd: int | None = None
    if fcntl is None:
      return
    while True:
      fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except BlockingIOError:
        raw = os.pread(fd, 4096, 0)
        os.close(fd)
        raise EngramError(
          f'run folder {folder} is in use by another run ({_holder(raw)}): one writer per folder; wait until it '
          'ends or write this run elsewhere (hydra.run.dir=...)'
        ) from None
      except OSError as e:  # a file system without flock: the run goes on unlocked
        os.close(fd)
        warnings.warn(f'run folder {folder} cannot be locked ({e}): another run into it would not be refused')
        return
      try:
        same = os.path.samestat(os.fstat(fd), os.stat(self.path))
      except FileNotFoundError:
        same = False
      if same:  # else its holder removed the file as it released it: lock the new one
        break
      os.close(fd)
    raw = os.pread(fd, 4096, 0)
    if raw.strip():  # a lock file is removed at release: this one's holder was killed (its flock went with it)
      self.stale = _holder(raw)
      log.info('run folder %s: cleared the lock of a run that was killed (%s)', folder, self.stale)
    info = {
      'pid': os.getpid(),
      'host': socket.gethostname(),
      'since': time.strftime('%Y-%m-%dT%H:%M:%S%z'),
      'argv': [os.path.basename(sys.executable), *sys.argv],
    }
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(info) + '\n').encode('utf-8'), 0)
    self._fd = fd
    self._release = weakref.finalize(self, _unlock, fd, str(self.path), os.getpid())

  @property
  def held(self) -> bool:
    return self._fd is not None and self._release.alive

  def release(self) -> None:
    """Release the lock (idempotent)."""
    if self._fd is not None:
      self._release()


@dataclasses.dataclass(eq=False)
class Run:
  """A run writing its folder (:func:`begin`): ``outputs`` are the names it writes (files or folders); it holds the
  folder's lock (``lock``) until :meth:`finish` or :meth:`release` (also as ``with run:``), ``written`` the sha256
  of each file it wrote (:func:`write_file`), ``hydra`` the bytes of Hydra's files of the run at :func:`begin`."""

  folder: Path
  outputs: tuple[str, ...]
  run_id: str
  lock: FolderLock | None = None
  written: dict[str, str] = dataclasses.field(default_factory=dict)
  hydra: dict[str, bytes] = dataclasses.field(default_factory=dict)

  def __enter__(self) -> Run:
    return self

  def __exit__(self, *exc) -> None:
    self.release()

  def release(self) -> None:
    """Release the folder's lock (idempotent): another run may write the folder from now on."""
    key = self.folder.resolve()
    if _active.get(key) is self:
      del _active[key]
    if self.lock is not None:
      self.lock.release()

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
    folder) and of Hydra's files of the run; then release the folder. Returns the marker.

    Raises:
      EngramError: (one line; no marker written) an output file this run did not write, or one changed since.
    """
    try:
      names = [n for out in self.outputs for n in _files_under(self.folder, out)]
      if self.lock is not None:  # a run of begin(): it vouches only for what it wrote (mark() vouches for what is)
        for name in names:
          if name not in self.written:
            raise refuse(self.folder, f'file {name} was not written by this run (another process writes into it)')
          if sha256_file(self.folder / name) != self.written[name]:
            raise refuse(self.folder, f'file {name} changed after this run wrote it (another process writes into it)')
      for name, raw in self.hydra.items():  # another process's Hydra rewrote them while this run held the folder
        target = self.folder / name
        if not target.is_file() or target.read_bytes() != raw:
          write_file(target, raw)
      if self.lock is not None:  # Hydra's files of this run (as they were at begin), never another process's
        names += list(self.hydra)
      else:
        names += [n for n in HYDRA_FILES if (self.folder / n).is_file()]
      return _write_marker(self.folder, names, self.run_id, info)
    finally:
      self.release()


def _write_marker(folder: Path, names: Iterable[str], run_id: str, info: dict[str, Any] | None) -> dict[str, Any]:
  marker = {
    'format': FORMAT,
    'run_id': run_id,
    'finished': time.strftime('%Y-%m-%dT%H:%M:%S%z'),
    'files': {n: sha256_file(folder / n) for n in sorted(set(names))},
    **dict(info or {}),
  }
  write_file(folder / MARKER, json.dumps(marker, indent=1) + '\n')
  return marker


def begin(folder: Path | str, outputs: Iterable[str], expect: Mapping[str, str | bytes] | None = None) -> Run:
  """Start a run into ``folder`` (created): take the folder's lock (refused, one line, while another run holds it),
  remove the old marker first, then each of ``outputs`` an earlier run left (a file, or a folder with all it holds),
  so that a run killed at any point leaves a folder every reader refuses (module docstring: why clear rather than
  refuse). ``expect``: files already in the folder that are this run's, by their content (Hydra's
  ``.hydra/overrides.yaml`` as this process's Hydra wrote it), refused when another run rewrote them before the
  lock was taken. Returns the :class:`Run` that writes the folder and holds its lock until it finishes.

  Raises:
    EngramError: one line, the folder in use by another run (its holder named), or a file of ``expect`` not this
      run's.
  """
  folder = Path(folder)
  folder.mkdir(parents=True, exist_ok=True)
  lock = FolderLock(folder)
  run = Run(folder, tuple(dict.fromkeys(outputs)), uuid.uuid4().hex, lock)
  try:
    for name, data in (expect or {}).items():
      raw = data.encode('utf-8') if isinstance(data, str) else bytes(data)
      if not (folder / name).is_file() or (folder / name).read_bytes() != raw:
        raise EngramError(
          f"run folder {folder}: file {name} is not this run's (another run started into this folder at the same "
          'time and rewrote it): one writer per folder; rerun each run into its own folder (hydra.run.dir=...)'
        )
    run.hydra = {n: (folder / n).read_bytes() for n in HYDRA_FILES if (folder / n).is_file()}
    marker = folder / MARKER
    if marker.exists() or marker.is_symlink():
      _step(marker)
      marker.unlink()
    for name in run.outputs:
      path = folder / name
      if path.is_dir() and not path.is_symlink():
        _step(path)
        shutil.rmtree(path)
      elif path.exists() or path.is_symlink():
        _step(path)
        path.unlink()
  except BaseException:
    lock.release()
    raise
  _active[folder.resolve()] = run
  return run


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
  or one written before run markers, once checked); refused while a run holds the folder. Returns the marker."""
  folder = Path(folder)
  lock = FolderLock(folder)
  try:
    return Run(folder, tuple(outputs), uuid.uuid4().hex).finish()
  finally:
    lock.release()
