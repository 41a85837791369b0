"""On-disk cache of reader answers, keyed by the reader's spec and the exact prompt.

Layout: ``<cache_dir>/answers/<spec key[:16]>/<prompt key[:2]>/<prompt key>.json`` with
``{"spec", "messages", "answer"}``; spec key = sha256 of the canonical JSON of the spec (model fingerprint and
generation settings, :meth:`engram_jax.answer.reader.HFReader.spec`), prompt key = sha256 of the canonical JSON of
``[spec, messages]``. Each answer is written through a temporary file in the same folder, flushed, then
``os.replace``: an interrupted run leaves whole answers only, and the next run generates just the missing ones.
A stored entry whose spec or messages differ from the request (a hash collision or a hand-edited file) raises; a
damaged entry (0 bytes or truncated, e.g. a copy interrupted outside this cache) is discarded with a warning and
counted (``damaged``), and its answer is made again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engram_jax.core.errors import EngramError

log = logging.getLogger(__name__)
Messages = list[dict[str, str]]


def canonical(obj: Any) -> str:
  return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(',', ':'))


def spec_key(spec: dict[str, Any]) -> str:
  return hashlib.sha256(canonical(spec).encode('utf-8')).hexdigest()


def prompt_key(spec: dict[str, Any], messages: Messages) -> str:
  return hashlib.sha256(canonical([spec, messages]).encode('utf-8')).hexdigest()


class AnswerCache:
  """Answers of one reader spec under ``root`` (``<cache_dir>/answers``)."""

  def __init__(self, root: str | os.PathLike, spec: dict[str, Any]):
    self.spec = dict(spec)
    self.folder = Path(root) / spec_key(self.spec)[:16]
    self.hits = 0
    self.writes = 0
    self.damaged = 0  # damaged entries discarded (and answered again)

  def path(self, messages: Messages) -> Path:
    key = prompt_key(self.spec, messages)
    return self.folder / key[:2] / f'{key}.json'

  def get(self, messages: Messages) -> str | None:
    path = self.path(messages)
    if not path.is_file():
      return None
    try:
      entry = json.loads(path.read_text(encoding='utf-8'))
      if not isinstance(entry, dict) or not isinstance(entry.get('answer'), str):
        raise ValueError('not an answer entry')
    except (ValueError, UnicodeDecodeError) as e:  # 0 bytes or truncated (a crash outside put's atomic write)
      log.warning('answer cache entry %s is damaged (%s): discarded, the answer is made again', path, e)
      path.unlink(missing_ok=True)
      self.damaged += 1
      return None
    if entry.get('spec') != self.spec or entry.get('messages') != messages:
      raise EngramError(f'answer cache entry {path} does not match its key (spec or prompt differ)')
    self.hits += 1
    return entry['answer']

  def put(self, messages: Messages, answer: str) -> None:
    path = self.path(messages)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = canonical({'spec': self.spec, 'messages': messages, 'answer': answer}).encode('utf-8')
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f'.{path.name}.', suffix='.tmp')
    try:
      with os.fdopen(fd, 'wb') as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
      os.chmod(tmp, 0o644)
      os.replace(tmp, path)
    except BaseException:
      Path(tmp).unlink(missing_ok=True)
      raise
    self.writes += 1

  def missing(self, prompts: Sequence[Messages]) -> list[int]:
    """Indices of ``prompts`` without a stored answer."""
    return [i for i, m in enumerate(prompts) if not self.path(m).is_file()]
