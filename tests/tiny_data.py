"""Tiny data roots for end-to-end tests: the real files cut down so that every pipeline runs in seconds.

:func:`build_tiny_root` writes, under ``dest`` (same layout as the real data root, see each folder's SOURCE.md):

* ``locomo/locomo10.json``: two real conversations (conv-26, conv-30) cut to their first sessions (>= 50 turns
  each, so that even the 50-deep legs rank real items only), with the questions whose evidence lies in the kept
  sessions plus a few whose evidence was cut (the loader excludes and counts those);
* ``longmemeval/longmemeval_s_cleaned_498of500.json.gz``: a few real LongMemEval_S entries from the committed
  pilot list (scored under the official skip rules) and a few others (the training part), each haystack cut to
  its answer sessions plus filler sessions (>= 12 sessions, so every episode holds more than k=10 items) and each
  session to a few turns (every ``has_answer`` turn kept); ``longmemeval_oracle.json`` from the same entries'
  answer sessions;
* ``memoryagentbench/``: the two FactConsolidation files copied unchanged (they are small).

Every episode stays at <= 128 items and <= 64 questions, so JAX compiles one shape per pipeline for LoCoMo and
LongMemEval.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
from collections import defaultdict
from pathlib import Path
from typing import Any

from engram_jax.data import io, splits
from engram_jax.data.factconsolidation import FILES as FC_FILES
from engram_jax.data.longmemeval import FILES as LME_FILES

LOCOMO_CONVERSATIONS = ('conv-26', 'conv-30')
LOCOMO_SESSIONS = 3  # conv-26: 58 turns, 25 answerable questions; conv-30: 58 turns, 33
LOCOMO_CUT_QUESTIONS = 3  # questions per conversation whose evidence lies only in dropped sessions
LME_PILOT = 6  # scored pilot entries (not _abs, with user-side evidence)
LME_OTHER = 8  # non-pilot entries, the pool of the training part
LME_SESSIONS = 12  # sessions per haystack: the answer sessions, then fillers up to this many
LME_MIN_FILLERS = 4
LME_TURNS = 6  # turns kept per session (plus any has_answer turn beyond them)
_DIA = re.compile(r'D(\d+):')


def _session_of(evidence: str) -> int | None:
  m = _DIA.match(str(evidence))
  return int(m[1]) if m else None


def tiny_locomo_sample(
  sample: dict[str, Any], *, n_sessions: int = LOCOMO_SESSIONS, n_cut: int = LOCOMO_CUT_QUESTIONS
) -> dict[str, Any]:
  """One LoCoMo sample with its first ``n_sessions`` sessions and the questions they can answer (+ ``n_cut``)."""
  conv = sample['conversation']
  keep = {'speaker_a': conv['speaker_a'], 'speaker_b': conv['speaker_b']}
  for n in range(1, n_sessions + 1):
    keep[f'session_{n}_date_time'] = conv[f'session_{n}_date_time']
    keep[f'session_{n}'] = conv[f'session_{n}']
  inside, cut = [], []
  for q in sample['qa']:
    sessions = [_session_of(e) for e in q['evidence']]
    if sessions and all(s is not None and s <= n_sessions for s in sessions):
      inside.append(q)
    elif sessions and all(s is not None and s > n_sessions for s in sessions):
      cut.append(q)
  return {'sample_id': sample['sample_id'], 'conversation': keep, 'qa': inside + cut[:n_cut]}


def write_locomo(source: Path, dest: Path, *, conversations=LOCOMO_CONVERSATIONS) -> Path:
  data = io.read_json(io.dataset_file(source, 'locomo', 'locomo10.json'))
  by_id = {s['sample_id']: s for s in data}
  out = dest / 'locomo' / 'locomo10.json'
  out.parent.mkdir(parents=True, exist_ok=True)
  out.write_text(json.dumps([tiny_locomo_sample(by_id[c]) for c in conversations]), encoding='utf-8')
  return out


def _user_evidence(entry: dict[str, Any]) -> bool:
  """Scored under the official skip rules at session level: not abstention, some user turn has the answer."""
  answer = set(entry['answer_session_ids'])
  return '_abs' not in entry['question_id'] and any(
    t.get('has_answer') and t['role'] == 'user'
    for sid, turns in zip(entry['haystack_session_ids'], entry['haystack_sessions'])
    if sid in answer
    for t in turns
  )


def _cut_turns(turns: list[dict[str, Any]], n: int = LME_TURNS) -> list[dict[str, Any]]:
  return [t for i, t in enumerate(turns) if i < n or t.get('has_answer')]


def _user_text(turns: list[dict[str, Any]]) -> str:
  return ' '.join(t['content'] for t in turns if t['role'] == 'user')


def tiny_longmemeval_entry(
  entry: dict[str, Any], *, n_sessions: int = LME_SESSIONS, min_fillers: int = LME_MIN_FILLERS
) -> dict[str, Any]:
  """One LongMemEval_S entry cut to its answer sessions plus the shortest filler sessions (the three haystack
  lists kept aligned, in their original order), each session cut to a few turns (has_answer turns kept)."""
  answer = set(entry['answer_session_ids'])
  rows = list(zip(entry['haystack_session_ids'], entry['haystack_dates'], entry['haystack_sessions']))
  seen: set[str] = set()
  fillers = []
  for i, (sid, _, turns) in enumerate(rows):
    text = _user_text(_cut_turns(turns))
    if sid not in answer and sid not in seen and text.strip():
      fillers.append((len(text), i))
    seen.add(sid)
  n_fill = max(min_fillers, n_sessions - len(answer))
  chosen = {i for i, (sid, _, _) in enumerate(rows) if sid in answer} | {i for _, i in sorted(fillers)[:n_fill]}
  kept = [rows[i] for i in sorted(chosen)]
  out = dict(entry)
  out['haystack_session_ids'] = [sid for sid, _, _ in kept]
  out['haystack_dates'] = [date for _, date, _ in kept]
  out['haystack_sessions'] = [_cut_turns(turns) for _, _, turns in kept]
  return out


def _round_robin(entries: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
  """``n`` entries, one question type after another (types in order of first appearance), file order within."""
  by_type: dict[str, list[dict[str, Any]]] = defaultdict(list)
  for e in entries:
    by_type[e['question_type']].append(e)
  out = []
  while len(out) < n and any(by_type.values()):
    for t in list(by_type):
      if by_type[t] and len(out) < n:
        out.append(by_type[t].pop(0))
  return out


def write_longmemeval(source: Path, dest: Path, *, n_pilot: int = LME_PILOT, n_other: int = LME_OTHER) -> Path:
  data = io.read_json(io.dataset_file(source, 'longmemeval', LME_FILES['s']))
  pilot = set(splits.pilot_ids('longmemeval_s'))
  scored = [e for e in data if _user_evidence(e)]
  chosen = _round_robin([e for e in scored if e['question_id'] in pilot], n_pilot) + _round_robin(
    [e for e in scored if e['question_id'] not in pilot], n_other
  )
  del data
  tiny = [tiny_longmemeval_entry(e) for e in chosen]
  folder = dest / 'longmemeval'
  folder.mkdir(parents=True, exist_ok=True)
  out = folder / LME_FILES['s']
  with gzip.open(out, 'wb') as f:
    f.write(json.dumps(tiny).encode('utf-8'))
  oracle = []
  for e in tiny:  # the oracle split holds the evidence sessions only
    rows = [
      r
      for r in zip(e['haystack_session_ids'], e['haystack_dates'], e['haystack_sessions'])
      if r[0] in set(e['answer_session_ids'])
    ]
    oracle.append(
      {
        **e,
        'haystack_session_ids': [r[0] for r in rows],
        'haystack_dates': [r[1] for r in rows],
        'haystack_sessions': [r[2] for r in rows],
      }
    )
  (folder / LME_FILES['oracle']).write_text(json.dumps(oracle), encoding='utf-8')
  return out


def copy_factconsolidation(source: Path, dest: Path) -> Path:
  folder = dest / 'memoryagentbench'
  folder.mkdir(parents=True, exist_ok=True)
  for name in FC_FILES.values():
    shutil.copyfile(io.dataset_file(source, 'memoryagentbench', name), folder / name)
  return folder


def build_tiny_root(dest: str | Path, source: str | Path | None = None) -> Path:
  """Write the tiny data root under ``dest`` from the real data root ``source`` (default: the resolved one)."""
  source, dest = io.resolve_data_root(source), Path(dest)
  write_locomo(source, dest)
  write_longmemeval(source, dest)
  copy_factconsolidation(source, dest)
  return dest


def have_real_data(source: str | Path | None = None) -> str | None:
  """None when every real file the tiny root is cut from exists, else the reason it cannot be built."""
  try:
    root = io.resolve_data_root(source)
  except FileNotFoundError as e:
    return str(e).splitlines()[0]
  need = [('locomo', 'locomo10.json'), ('longmemeval', LME_FILES['s'])]
  need += [('memoryagentbench', name) for name in FC_FILES.values()]
  missing = [f'{d}/{n}' for d, n in need if not (root / d / n).is_file()]
  return f'real data missing under {root}: {", ".join(missing)}' if missing else None
