"""Lucene's own BM25 ranking of a dataset's questions, and the project's Lucene-form leg compared with it per question.

  python -m experiments.lucene.reference --fetch                          # LoCoMo (1,982 questions)
  python -m experiments.lucene.reference --fetch dataset=longmemeval_s    # the LongMemEval_S pilot
  python -m experiments.lucene.reference dataset=locomo 'dataset.loader.conversations=[conv-26]'

Lucene is the reference, not a re-implementation of it: ``LuceneBm25.java`` (beside this file) indexes each episode's
items in memory with Anserini's default English analyzer and Lucene's ``BM25Similarity(k1, b)`` and searches each
question with Anserini's bag-of-words query, from the Anserini fat jar that PyPI's ``pyserini`` 2.4.0 ships
(``--fetch`` downloads its source archive without installing it, takes the jar out and checks its sha256; pyserini's
own Python search fetches a list of prebuilt indexes over the network at import, so it is not used). Java 21 or later
runs it (found on ``JAVA_HOME``, ``PATH`` or under ``/usr/lib/jvm``).

The comparison (``parity.json`` in the output folder, printed): per question, the project's top ``k`` under Lucene's
tie rule (the lower item first) against Lucene's; the largest score difference over every item Lucene returned; the
texts whose analyzer tokens differ from Lucene's (named); and, under the project's own tie rule (the later item
first), how many top ``k`` lists differ only by the order of tied scores.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from engram_jax.core.types import Episode

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
JAVA_SOURCE = HERE / 'LuceneBm25.java'
PYSERINI = 'pyserini==2.4.0'
JAR_MEMBER = 'pyserini-2.4.0/pyserini/resources/jars/anserini-2.3.0-fatjar.jar'
JAR_SHA256 = '375848a9bb0a7514d2a8fe13df20086961570991bf20343abf0e5312af977def'
JAVA_MIN = 21
CACHE = ROOT / '.cache' / 'lucene'
# Anserini's defaults for BM25 (and the Lucene baseline issue 49 measured): k1 0.9, b 0.4
K1, B = 0.9, 0.4


def java_version(java: str) -> int | None:
  """The major version of the ``java`` executable, or None when it does not run."""
  try:
    out = subprocess.run([java, '-version'], capture_output=True, text=True, timeout=60)
  except (OSError, subprocess.SubprocessError):
    return None
  m = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
  if not m:
    return None
  major = int(m.group(1))
  return int(m.group(2)) if major == 1 and m.group(2) else major


def find_java(min_version: int = JAVA_MIN) -> str | None:
  """A ``java`` of at least ``min_version``: ``$JAVA_HOME``, then ``PATH``, then ``/usr/lib/jvm/*``; None if none."""
  candidates = []
  if os.environ.get('JAVA_HOME'):
    candidates.append(str(Path(os.environ['JAVA_HOME']) / 'bin' / 'java'))
  if shutil.which('java'):
    candidates.append(shutil.which('java'))
  candidates += sorted(str(p) for p in Path('/usr/lib/jvm').glob('*/bin/java')) if Path('/usr/lib/jvm').is_dir() else []
  for java in candidates:
    version = java_version(java)
    if version is not None and version >= min_version:
      return java
  return None


def sha256(path: Path) -> str:
  h = hashlib.sha256()
  with open(path, 'rb') as f:
    for block in iter(lambda: f.read(1 << 20), b''):
      h.update(block)
  return h.hexdigest()


@functools.lru_cache(maxsize=8)
def _checked(path: str, size: int, mtime_ns: int) -> bool:
  """Whether the file (as of this size and modification time) has the pinned sha256: hashed once per process."""
  del size, mtime_ns  # the cache key: a changed file is hashed again
  return sha256(Path(path)) == JAR_SHA256


def jar_path(cache: Path = CACHE) -> Path | None:
  """The checked Anserini jar under ``cache``, or None when it is not there (or its sha256 differs)."""
  path = cache / Path(JAR_MEMBER).name
  if not path.is_file():
    return None
  st = path.stat()
  return path if _checked(str(path), st.st_size, st.st_mtime_ns) else None


def fetch_jar(cache: Path = CACHE) -> Path:
  """Download pyserini 2.4.0's source archive (no install, no dependencies), take its Anserini jar into ``cache`` and
  check its sha256.

  Raises:
    RuntimeError: pip failed, or the jar is missing from the archive or differs from the pinned sha256.
  """
  found = jar_path(cache)
  if found:
    return found
  cache.mkdir(parents=True, exist_ok=True)
  with tempfile.TemporaryDirectory() as tmp:
    cmd = [sys.executable, '-m', 'pip', 'download', '-q', '--no-deps', '--ignore-requires-python']
    cmd += ['--no-binary=:all:', PYSERINI, '-d', tmp]
    done = subprocess.run(cmd, capture_output=True, text=True)
    archives = list(Path(tmp).glob('pyserini-*.tar.gz'))
    if done.returncode != 0 or not archives:
      raise RuntimeError(f'could not download {PYSERINI}: {done.stderr.strip()[-500:]}')
    with tarfile.open(archives[0]) as tar:
      try:
        member = tar.getmember(JAR_MEMBER)
      except KeyError as e:
        raise RuntimeError(f'{archives[0].name} holds no {JAR_MEMBER}') from e
      part = cache / (Path(JAR_MEMBER).name + '.part')
      with tar.extractfile(member) as src, open(part, 'wb') as dst:
        shutil.copyfileobj(src, dst)
  if sha256(part) != JAR_SHA256:
    part.unlink()
    raise RuntimeError(f'the jar of {PYSERINI} differs from the pinned sha256 {JAR_SHA256}')
  path = cache / Path(JAR_MEMBER).name
  part.replace(path)
  return path


def _escape(text: str) -> str:
  return text.replace('\\', '\\\\').replace('\t', '\\t').replace('\n', '\\n').replace('\r', '\\r')


def write_tsv(episodes: Sequence[Episode], path: Path) -> None:
  """The Java program's input: a line per item (``D``) and per question (``Q``): kind, episode id, id, text."""
  with open(path, 'w', encoding='utf-8') as f:
    for ep in episodes:
      f.writelines(f'D\t{ep.id}\t{it.id}\t{_escape(it.text)}\n' for it in ep.items)
      f.writelines(f'Q\t{ep.id}\t{q.id}\t{_escape(q.text)}\n' for q in ep.questions)


@dataclasses.dataclass(frozen=True)
class LuceneRun:
  """Lucene's ranking (question id -> ``[(item id, score)]``, best first) and its analyzer's tokens
  (``(kind, episode id, id)`` -> tokens)."""

  run: dict[str, list[tuple[str, float]]]
  tokens: dict[tuple[str, str, str], list[str]]


def lucene_run(
  episodes: Sequence[Episode],
  folder: Path,
  *,
  java: str,
  jar: Path,
  k1: float = K1,
  b: float = B,
  depth: int = 1000,
) -> LuceneRun:
  """Run ``LuceneBm25.java`` on ``episodes`` (files under ``folder``: ``lucene.tsv``, ``lucene.trec``,
  ``lucene_tokens.tsv``)."""
  folder.mkdir(parents=True, exist_ok=True)
  tsv, trec, tok = folder / 'lucene.tsv', folder / 'lucene.trec', folder / 'lucene_tokens.tsv'
  write_tsv(episodes, tsv)
  cmd = [java, '-cp', str(jar), str(JAVA_SOURCE), str(tsv), str(trec), str(tok), str(k1), str(b), str(depth)]
  done = subprocess.run(cmd, capture_output=True, text=True)
  if done.returncode != 0:
    raise RuntimeError(f'LuceneBm25.java failed ({done.returncode}): {done.stderr.strip()[-2000:]}')
  run: dict[str, list[tuple[str, float]]] = collections.defaultdict(list)
  with open(trec, encoding='utf-8') as f:
    for line in f:
      qid, _, doc, _, score, _ = line.split()
      run[qid].append((doc, float(score)))
  tokens = {}
  with open(tok, encoding='utf-8') as f:
    for line in f:
      kind, ep, ident, text = line.rstrip('\n').split('\t', 3)
      tokens[(kind, ep, ident)] = text.split(' ') if text else []
  return LuceneRun(dict(run), tokens)


def project_scores(
  episodes: Sequence[Episode], *, tokenizer: str = 'english', form: str = 'lucene', k1: float = K1, b: float = B
) -> list[np.ndarray]:
  """The project's BM25 leg (:func:`engram_jax.ops.bm25.bm25_leg`) per episode: ``[Q_real, N_real]`` scores."""
  from engram_jax.core.batch import episode_arrays
  from engram_jax.ops.bm25 import bm25_leg

  out = []
  for ep in episodes:
    n, q = ep.n_items, len(ep.questions)
    zeros = np.zeros((n, 1), np.float32), np.zeros((q, 1), np.float32)  # BM25 reads no vector
    arrays = episode_arrays(ep, *zeros, unit_norm=False, tokenizers=[tokenizer])
    scores = bm25_leg(arrays, None, k1=k1, b=b, tokenizer=tokenizer, form=form)
    out.append(np.asarray(scores)[:q, :n])
  return out


def _top(scores: np.ndarray, k: int, *, later_first: bool) -> list[int]:
  """Top ``k`` indices by score; ties: the lower index first (Lucene's docid order) or the later (the project's)."""
  order = np.lexsort((-np.arange(len(scores)) if later_first else np.arange(len(scores)), -scores))
  return [int(i) for i in order[:k]]


def compare(
  episodes: Sequence[Episode],
  lucene: LuceneRun,
  scores: Sequence[np.ndarray],
  *,
  tokenizer: str = 'english',
  k: int = 10,
) -> dict[str, Any]:
  """Per-question agreement of the project's scores with Lucene's run (the module docstring says what is counted)."""
  from engram_jax.core.lexicon import get_tokenizer

  analyze = get_tokenizer(tokenizer)
  counts: collections.Counter = collections.Counter()
  token_diffs: list[dict[str, Any]] = []
  differ: list[dict[str, Any]] = []
  max_diff = 0.0
  for ep, s in zip(episodes, scores):
    ids = [it.id for it in ep.items]
    index = {x: i for i, x in enumerate(ids)}
    for kind, rows in (('D', ep.items), ('Q', ep.questions)):
      for row in rows:
        ours, theirs = analyze(row.text), lucene.tokens[(kind, ep.id, row.id)]
        if ours != theirs:
          counts['texts_tokens_differ'] += 1
          if len(token_diffs) < 20:
            token_diffs.append({'id': row.id, 'ours': ours, 'lucene': theirs})
        counts['texts'] += 1
    for qi, q in enumerate(ep.questions):
      counts['questions'] += 1
      hits = lucene.run.get(q.id, [])
      if not hits:
        counts['lucene_no_hits'] += 1
        counts['ours_all_zero_where_lucene_no_hits'] += bool(np.all(s[qi] == 0))
        continue
      diff = max(abs(float(s[qi][index[d]]) - v) for d, v in hits)
      max_diff = max(max_diff, diff)
      counts['score_diff_gt_1e-4'] += diff > 1e-4
      n_top = min(k, len(hits))
      ours = [ids[i] for i in _top(s[qi], n_top, later_first=False)]
      theirs = [d for d, _ in hits[:n_top]]
      counts['fewer_than_k_hits'] += len(hits) < k
      if ours == theirs:
        counts['top_k_equal'] += 1
      else:
        counts['top_k_differ'] += 1
        if len(differ) < 20:
          differ.append({'question': q.id, 'ours': ours, 'lucene': theirs})
      own = [ids[i] for i in _top(s[qi], n_top, later_first=True)]
      if own != ours:
        counts['project_tie_rule_reorders'] += 1
        counts['project_tie_rule_reorders_same_set'] += set(own) == set(ours)
  return {
    'k': k,
    'tokenizer': tokenizer,
    'counts': dict(sorted(counts.items())),
    'max_abs_score_diff': max_diff,
    'token_diffs': token_diffs,
    'top_k_differ': differ,
  }


def load_episodes(overrides: Sequence[str]) -> list[Episode]:
  """The episodes of the dataset config that ``overrides`` select (``conf/config.yaml``; e.g. ``dataset=locomo``)."""
  from hydra import compose, initialize_config_dir

  from experiments.lib import common

  with initialize_config_dir(config_dir=str(ROOT / 'conf'), version_base='1.3'):
    cfg = compose(config_name='config', overrides=list(overrides))
  episodes, _ = common.load_dataset(cfg, cfg.dataset)
  return episodes


def summary(report: Mapping[str, Any]) -> str:
  c = report['counts']
  lines = [
    f"{c.get('questions', 0)} questions: top-{report['k']} equal to Lucene's {c.get('top_k_equal', 0)}, differ "
    f'{c.get("top_k_differ", 0)}; Lucene returned nothing for {c.get("lucene_no_hits", 0)}; max |score diff| '
    f'{report["max_abs_score_diff"]:.2e} ({c.get("score_diff_gt_1e-4", 0)} questions over 1e-4)',
    f"{c.get('texts', 0)} texts analysed: tokens differ from Lucene's in {c.get('texts_tokens_differ', 0)}",
    f"under the project's tie rule (later item first) {c.get('project_tie_rule_reorders', 0)} top-{report['k']} "
    f'lists reorder tied items ({c.get("project_tie_rule_reorders_same_set", 0)} with the same set)',
  ]
  return '\n'.join(lines)


def main(argv: Sequence[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('overrides', nargs='*', default=[], help='Hydra overrides of conf/config.yaml (dataset=...)')
  ap.add_argument('--fetch', action='store_true', help=f'download the Anserini jar ({PYSERINI}) when not cached')
  ap.add_argument('--fetch-only', action='store_true', help='only fetch the jar (CI does, so the parity test runs)')
  ap.add_argument('--k1', type=float, default=K1)
  ap.add_argument('--b', type=float, default=B)
  ap.add_argument('--k', type=int, default=10)
  ap.add_argument('--out', default=None, help='output folder (default outputs/lucene/<dataset name>)')
  args = ap.parse_args(argv)
  if args.k < 1:
    ap.error(f'--k must be >= 1, got {args.k}')
  jar = fetch_jar() if args.fetch or args.fetch_only else jar_path()
  if args.fetch_only:
    print(jar)
    return 0
  if jar is None:
    ap.error(f'no Anserini jar under {CACHE}: pass --fetch to download {PYSERINI} and take its jar')
  java = find_java()
  if java is None:
    ap.error(f'no Java {JAVA_MIN}+ found (JAVA_HOME, PATH, /usr/lib/jvm); the Anserini jar needs it')
  episodes = load_episodes(args.overrides)
  name = next((o.split('=', 1)[1] for o in args.overrides if o.startswith('dataset=')), 'locomo')
  out = Path(args.out or ROOT / 'outputs' / 'lucene' / name)
  lucene = lucene_run(episodes, out, java=java, jar=jar, k1=args.k1, b=args.b)
  report = compare(episodes, lucene, project_scores(episodes, k1=args.k1, b=args.b), k=args.k)
  report.update({'dataset': name, 'overrides': list(args.overrides), 'k1': args.k1, 'b': args.b, 'jar': JAR_SHA256})
  (out / 'parity.json').write_text(json.dumps(report, indent=1) + '\n')
  print(summary(report))
  print(f'written: {out / "parity.json"}')
  return 0


if __name__ == '__main__':
  raise SystemExit(main())
