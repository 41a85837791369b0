"""Jobs of a sweep share one embedding cache: concurrent writers and readers, and the multi-process encoder pool.

Writers and the reader are spawned processes released together by a barrier; the encoder sleeps on each call, so
that the jobs really overlap (each holds a chunk while another one lists, reads or waits for it).
"""

import dataclasses
import json
import multiprocessing
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from engram_jax.data import embed

DIM = 1024
SHARD = 16  # texts per shard: many small shards, many chances to race
TEXTS = [f'turn {i}: {" ".join(f"w{(i * j) % 97}" for j in range(1, 2 + i % 7))}' for i in range(360)]


@dataclasses.dataclass(frozen=True)
class SlowHashing:
  """The hashing encoder (same spec, same vectors) that takes ``delay`` seconds per call."""

  dim: int = DIM
  delay: float = 0.002

  @property
  def spec(self):
    return embed.hashing_encoder(self.dim).spec

  def __call__(self, texts):
    time.sleep(self.delay)
    return embed.hashing_encoder(self.dim)(texts)


def _fresh(texts):
  """What a cold, lone job returns: the encoder's output, normalised once more as ``embed_texts`` does."""
  v = embed.hashing_encoder(DIM)(list(texts))
  return v / np.linalg.norm(v, axis=-1, keepdims=True)


def _writer(cache_dir, texts, barrier, out):
  barrier.wait()
  vecs, report = embed.embed_with_report(
    texts, cache_dir=cache_dir, model_id='h', encoder=SlowHashing(), shard_size=SHARD, progress=False
  )
  ok = bool(np.array_equal(vecs, _fresh(texts)))
  Path(out).write_text(json.dumps({'report': report.as_dict(), 'equal_to_fresh': ok}))


def _reader(cache_dir, barrier, stop, out):
  """Load the cache over and over while the writers run: every load must find only whole, correct shards."""
  barrier.wait()
  loads, problems, wrong = 0, [], 0
  by_key = {embed.entry_key(embed.spec_hash(SlowHashing().spec), t): t for t in TEXTS}
  while True:
    last = stop.is_set()
    cache = embed.EmbeddingCache(cache_dir, 'h', SlowHashing().spec)
    table = cache.load()
    loads += 1
    problems += cache.problems
    if table:
      keys = list(table)
      wrong += int(np.sum(np.stack([table[k] for k in keys]) != _fresh([by_key[k] for k in keys])))
    if last:
      break
  Path(out).write_text(json.dumps({'loads': loads, 'problems': problems, 'wrong': wrong}))


def _run_jobs(tmp_path, text_sets, *, reader=False):
  ctx = multiprocessing.get_context('spawn')
  barrier = ctx.Barrier(len(text_sets) + int(reader))
  stop = ctx.Event()
  cache = str(tmp_path / 'cache')
  procs = [
    ctx.Process(target=_writer, args=(cache, texts, barrier, str(tmp_path / f'w{i}.json')))
    for i, texts in enumerate(text_sets)
  ]
  if reader:
    procs.append(ctx.Process(target=_reader, args=(cache, barrier, stop, str(tmp_path / 'reader.json'))))
  for p in procs:
    p.start()
  for p in procs[: len(text_sets)]:
    p.join(120)
  stop.set()
  for p in procs[len(text_sets) :]:
    p.join(120)
  assert [p.exitcode for p in procs] == [0] * len(procs)
  writers = [json.loads((tmp_path / f'w{i}.json').read_text()) for i in range(len(text_sets))]
  return writers, (json.loads((tmp_path / 'reader.json').read_text()) if reader else None)


def _shard_rows(cache_dir):
  """Every ``(key, vector)`` row of every shard file, read on its own (duplicates kept)."""
  rows = []
  for shard in sorted(Path(cache_dir).rglob('shard-*.npz')):
    with np.load(shard) as z:
      rows += list(zip(z['keys'].tolist(), z['vecs']))
  return rows


def _check_cache(cache_dir, texts):
  """Every row of every shard equals a fresh embedding of its text; a new reader loads exactly ``texts``."""
  spec = SlowHashing().spec
  by_key = {embed.entry_key(embed.spec_hash(spec), t): t for t in texts}
  rows = _shard_rows(cache_dir)
  assert {k for k, _ in rows} == set(by_key)
  np.testing.assert_array_equal(np.stack([v for _, v in rows]), _fresh([by_key[k] for k, _ in rows]))
  assert not list(Path(cache_dir).rglob('*.tmp'))
  cache = embed.EmbeddingCache(cache_dir, 'h', spec)
  table = cache.load()
  assert set(table) == set(by_key) and cache.problems == [] and cache.rebuilt == []
  vecs, report = embed.embed_with_report(
    texts, cache_dir=cache_dir, model_id='h', encoder=SlowHashing(), progress=False
  )
  assert (report.cached, report.embedded) == (len(texts), 0)
  np.testing.assert_array_equal(vecs, _fresh(texts))
  return rows


@pytest.mark.slow
def test_overlapping_jobs_and_a_reader_share_one_cache(tmp_path):
  """Two jobs embed overlapping text sets at once (the overlap split into other chunks by each) while a third
  process keeps loading the cache: both finish with fresh-equal vectors, the reader never meets a partial or bad
  shard, and afterwards every cached row is correct and a new reader loads the union."""
  a, b = TEXTS[:240], TEXTS[120:]
  writers, reader = _run_jobs(tmp_path, [a, b], reader=True)
  assert all(w['equal_to_fresh'] for w in writers)
  assert all(w['report']['rebuilt'] == [] and w['report']['problems'] == [] for w in writers)
  assert reader['loads'] >= 2 and reader['problems'] == [] and reader['wrong'] == 0
  _check_cache(tmp_path / 'cache', TEXTS)


@pytest.mark.slow
def test_jobs_missing_the_same_texts_embed_each_once(tmp_path):
  """Two jobs with the same texts, released together: each chunk is encoded by one of them (the other waits on
  the chunk's lock and reads its shard), so the cache holds each text once."""
  texts = TEXTS[:240]
  writers, _ = _run_jobs(tmp_path, [texts, texts])
  assert all(w['equal_to_fresh'] for w in writers)
  assert sum(w['report']['embedded'] for w in writers) == len(texts)
  assert all(w['report']['embedded'] + w['report']['cached'] == len(texts) for w in writers)
  rows = _check_cache(tmp_path / 'cache', texts)
  assert len(rows) == len(texts)  # no duplicates


def test_a_bad_shard_replaced_since_it_was_read_is_kept(tmp_path):
  """A reader that found a shard bad deletes it only if it is still the file it read: a good copy that another
  job wrote meanwhile survives."""
  enc = SlowHashing(delay=0.0)
  embed.embed_texts(TEXTS[:4], cache_dir=tmp_path, model_id='h', encoder=enc, progress=False)
  cache = embed.EmbeddingCache(tmp_path, 'h', enc.spec)
  shard = next(cache.dir.glob('shard-*.npz'))
  good = shard.read_bytes()
  shard.write_bytes(b'not a zip')
  stale = shard.stat()
  time.sleep(0.01)
  embed.atomic_write(shard, lambda f: f.write(good))
  cache._discard(shard, 'unreadable (test)', 0, stale)
  assert shard.read_bytes() == good
  cache._discard(shard, 'unreadable (test)', 0, shard.stat())
  assert not shard.exists()


def test_a_file_being_written_is_never_seen_by_readers(tmp_path):
  """Mid-write, the target still holds the old whole file and a reader's listing holds no new name; the
  temporary file is hidden, and gone afterwards."""
  path = tmp_path / 'shard-x.npz'
  path.write_bytes(b'old')

  def write(f):
    f.write(b'new, half')
    assert path.read_bytes() == b'old'
    assert [p.name for p in tmp_path.glob('shard-*.npz')] == ['shard-x.npz']
    assert all(p.name.startswith('.') for p in tmp_path.iterdir() if p != path)
    f.write(b' and the rest')

  embed.atomic_write(path, write)
  assert path.read_bytes() == b'new, half and the rest' and [p.name for p in tmp_path.iterdir()] == ['shard-x.npz']


def test_cache_files_are_readable_by_the_group(tmp_path):
  """Shards get ``0666 & ~umask`` (mkstemp alone would give 0600, unreadable to a group sharing the cache)."""
  embed.embed_texts(TEXTS[:3], cache_dir=tmp_path, model_id='h', encoder=SlowHashing(delay=0.0), progress=False)
  for path in list(tmp_path.rglob('shard-*.npz')) + list(tmp_path.rglob('spec.json')):
    assert path.stat().st_mode & 0o777 == 0o666 & ~embed.UMASK


@pytest.mark.slow
def test_pool_of_processes_gives_the_one_process_vectors(tmp_path):
  """``processes=2`` (sentence-transformers' multi-process pool) returns the one-process vectors within 1e-5,
  through the cache, which this process alone writes. The pool starts under loky's global start method, as in a
  job of Hydra's joblib launcher, where its spawned workers used to die at start-up and the pool hang. About
  10-30 s: two spawned workers load the model."""
  pytest.importorskip('joblib')
  from joblib.externals.loky.backend import context  # noqa: F401  (its import sets loky's global start method)

  texts = [
    'I adopted a dog last week.',
    'The invoice is overdue.',
    'ok',
    'We went hiking in the Alps ' * 12,
    'What did Caroline paint?',
    'Melanie ran a charity race on Sunday, 20 May 2023.',
  ] * 2
  one = embed.sentence_transformer_encoder(batch_size=4, backend='torch')  # the pool is torch's (auto: one process)
  pooled = embed.sentence_transformer_encoder(batch_size=4, processes=2, backend='torch')
  assert pooled.spec == one.spec  # processes does not key the cache
  want = one(texts)
  got = {}

  def run():
    got['vecs'] = embed.embed_texts(texts, cache_dir=tmp_path, encoder=pooled, shard_size=5, progress=False)
    got['workers'] = len(pooled.pool['processes'])

  method = multiprocessing.get_start_method(allow_none=True)
  multiprocessing.set_start_method('loky', force=True)
  try:
    worker = threading.Thread(target=run, daemon=True)  # a hung pool fails the test instead of blocking it
    worker.start()
    worker.join(180)
  finally:
    multiprocessing.set_start_method(method, force=True)
    pooled.close()
  assert multiprocessing.get_start_method(allow_none=True) == method
  assert got.get('workers') == 2, 'the pool did not encode within 180 s'
  np.testing.assert_allclose(got['vecs'], want, atol=1e-5)
  assert 'pool' not in pooled.__dict__
  assert len(list(tmp_path.rglob('shard-*.npz'))) == 2  # 6 distinct texts, shards of 5
