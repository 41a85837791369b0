"""Compare Tier-1 readers on a dataset's oracle row (the gold evidence only, the prompts of
:func:`engram_jax.answer.tier1.build_prompt`): the oracle score (SubEM or LoCoMo F1, 95% interval, per category),
LoCoMo's category-5 option positions (:func:`engram_jax.answer.tier1.position_shares`), answers per second batched
and one at a time, the load time (``cold``: the GGUF dequantised now; ``warm``: read from the cache) and the peak
memory. Every answer is generated (nothing read from the answer cache, so the speeds are real) and then stored in
the answer cache, where a later Tier-1 run with the same reader finds the oracle row.

  python -m experiments.research.reader_compare --reader gemma3_270m --dataset fc_sh_6k
  python -m experiments.research.reader_compare --reader smollm2 --dataset locomo_answer --questions 60 --out outputs/rc

``--questions N`` answers a seeded subset (the one ``reader.questions=N`` picks in a Tier-1 run, seed ``seed``);
``--one-at-a-time M`` times the first M prompts again with batch size 1 (and counts replies that differ from the
batched ones). ``--timing-k K --timing-prompts M`` also times M prompts of a retriever row's length: each holds K
items (the gold items and their neighbours in write order), for the cost of a k=K row; they are not scored. Writes
``reader_compare_<reader>_<dataset>.json`` into ``--out`` when given.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path
from typing import Any

import numpy as np


def peak_rss_mib() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def compose(overrides: list[str]):
  from hydra import compose as hydra_compose
  from hydra import initialize_config_dir

  conf = Path(__file__).resolve().parents[2] / 'conf'
  with initialize_config_dir(config_dir=str(conf), version_base='1.3'):
    return hydra_compose(config_name='config', overrides=overrides)


def compare(
  reader_name: str,
  dataset: str,
  *,
  questions: int | None = None,
  one_at_a_time: int = 8,
  batch_size: int = 16,
  overrides: list[str] | None = None,
  timing_k: int = 0,
  timing_prompts: int = 0,
) -> dict[str, Any]:
  """Answer the oracle row of ``dataset`` with ``reader_name``; returns the scores, speeds, load and memory."""
  from engram_jax.answer import cache as answer_cache
  from engram_jax.answer import reader as reader_lib
  from engram_jax.answer import tier1
  from experiments.lib import answer as answer_lib
  from experiments.lib import common

  cfg = compose([f'dataset={dataset}', f'reader={reader_name}', f'reader.batch_size={batch_size}', *(overrides or [])])
  spec = cfg.dataset.get('answer')
  if spec is None:
    raise SystemExit(f'dataset {dataset} declares no answer task')
  task, max_new, seed = str(spec.task), int(spec.max_new_tokens), int(cfg.seed)
  episodes, _ = common.load_dataset(cfg, cfg.dataset)
  pairs = sorted(((e, q) for e in episodes for q in e.questions), key=lambda eq: eq[1].id)
  keep = answer_lib.subset([q.id for _, q in pairs], questions, seed=seed)
  pairs = [pairs[i] for i in keep]
  prompts = [tier1.build_prompt(task, e, q, list(q.gold), seed=seed) for e, q in pairs]
  messages = [p.messages for p in prompts]

  rss_before = peak_rss_mib()
  r = cfg.reader
  reader, load = reader_lib.load_reader(
    str(r.name),
    model=r.get('model'),
    device=str(r.device),
    dtype=str(r.dtype),
    batch_size=batch_size,
    cache_dir=cfg.paths.cache_dir,
    threads=r.get('threads'),
    prompt=r.get('prompt'),
    gguf_file=r.get('gguf_file'),
  )
  rss_load = peak_rss_mib()

  order = sorted(range(len(messages)), key=lambda i: len(answer_cache.canonical(messages[i])))  # as answer_all
  replies: list[str] = [''] * len(messages)
  t0 = time.perf_counter()
  for at in range(0, len(order), batch_size):
    chunk = order[at : at + batch_size]
    for i, rep in zip(chunk, reader.generate([messages[i] for i in chunk], max_new_tokens=max_new)):
      replies[i] = rep
  batched_s = time.perf_counter() - t0
  rss_gen = peak_rss_mib()

  m = min(one_at_a_time, len(messages))
  reader.batch_size = 1
  t0 = time.perf_counter()
  single = [reader.generate([messages[i]], max_new_tokens=max_new)[0] for i in range(m)]
  single_s = time.perf_counter() - t0
  reader.batch_size = batch_size

  timed_k = None
  if timing_k and timing_prompts:
    long = [tier1.build_prompt(task, e, q, padded(e, q, timing_k), seed=seed).messages for e, q in pairs]
    long = long[:timing_prompts]
    t0 = time.perf_counter()
    for at in range(0, len(long), batch_size):
      reader.generate(long[at : at + batch_size], max_new_tokens=max_new)
    sec = time.perf_counter() - t0
    timed_k = {
      'k': timing_k,
      'answers': len(long),
      'seconds': sec,
      'answers_per_second': len(long) / sec,
      'mean_prompt_chars': float(np.mean([sum(len(x['content']) for x in msg) for msg in long])),
    }
  cache = answer_cache.AnswerCache(Path(cfg.paths.cache_dir) / 'answers', reader.spec(max_new))
  for msg, rep in zip(messages, replies):
    if cache.get(msg) is None:
      cache.put(msg, rep)

  scores = np.array([tier1.score(task, rep, q, p) for rep, (_, q), p in zip(replies, pairs, prompts)])
  binary = task == 'factconsolidation'
  ci = tier1.interval(scores, binary=binary, seed=seed, n_resamples=int(cfg.eval.n_resamples))
  cats = sorted({q.category for _, q in pairs}, key=str)
  out: dict[str, Any] = {
    'reader': reader_name,
    'spec': reader.spec(max_new),
    'dataset': dataset,
    'task': task,
    'metric': 'SubEM' if binary else 'F1',
    'n_questions': len(pairs),
    'subset': None if questions is None else {'n': len(pairs), 'seed': seed},
    'oracle': {'mean': ci.mean, 'lo': ci.lo, 'hi': ci.hi},
    'by_category': {str(c): float(scores[[q.category == c for _, q in pairs]].mean()) for c in cats},
    'load': {'seconds': load.seconds, 'cold': load.dequantised_now, 'folder': load.folder},
    'batched': {
      'batch_size': batch_size,
      'answers': len(messages),
      'seconds': batched_s,
      'answers_per_second': len(messages) / batched_s,
    },
    'one_at_a_time': {
      'answers': m,
      'seconds': single_s,
      'answers_per_second': m / single_s if single_s else float('nan'),
      'replies_differing_from_batched': sum(a != replies[i] for i, a in enumerate(single)),
    },
    'timing_k': timed_k,
    'peak_rss_mib': {'before_load': rss_before, 'after_load': rss_load, 'after_generation': rss_gen},
    'mean_prompt_chars': float(np.mean([sum(len(x['content']) for x in msg) for msg in messages])),
    'replies': {q.id: rep for (_, q), rep in zip(pairs, replies)},
  }
  if task == 'locomo':
    cat5 = [i for i, (_, q) in enumerate(pairs) if q.category == 5]
    if cat5:
      out['position_bias'] = tier1.position_shares([replies[i] for i in cat5], [prompts[i].choices for i in cat5])
  return out


def padded(episode, question, k: int) -> list[str]:
  """The gold item ids and then their nearest neighbours in write order, ``min(k, items)`` distinct ids (a prompt of
  a k-item row's length, for timing)."""
  pos = episode.index_of()
  ids = list(dict.fromkeys(question.gold))[:k]
  centre = pos[ids[0]]
  for d in range(1, episode.n_items):
    if len(ids) >= min(k, episode.n_items):
      break
    for j in (centre - d, centre + d):
      if 0 <= j < episode.n_items and episode.items[j].id not in ids and len(ids) < k:
        ids.append(episode.items[j].id)
  return ids


def summary(res: dict[str, Any]) -> str:
  o, b, s, ld = res['oracle'], res['batched'], res['one_at_a_time'], res['load']
  line = (
    f'{res["reader"]} on {res["dataset"]} oracle ({res["n_questions"]} questions): {res["metric"]} {o["mean"]:.3f} '
    f'[{o["lo"]:.3f}, {o["hi"]:.3f}]; {b["answers_per_second"]:.3f} answers/s batched ({b["batch_size"]}), '
    f'{s["answers_per_second"]:.3f} one at a time ({s["answers"]}, {s["replies_differing_from_batched"]} replies '
    f'differ); load {ld["seconds"]:.1f} s ({"cold" if ld["cold"] else "warm"}); peak RSS '
    f'{res["peak_rss_mib"]["after_generation"]:.0f} MiB'
  )
  if res.get('timing_k'):
    t = res['timing_k']
    line += f'; k={t["k"]} prompts: {t["answers_per_second"]:.3f} answers/s batched ({t["answers"]})'
  if 'position_bias' in res:
    pb = res['position_bias']
    line += (
      f'; category 5: correct at (a)/(b) {pb["gold"]["a"]:.2f}/{pb["gold"]["b"]:.2f}, replies (a)/(b)/neither '
      f'{pb["replies"]["a"]:.2f}/{pb["replies"]["b"]:.2f}/{pb["replies"]["other"]:.2f}'
    )
  return line


def main(argv: list[str] | None = None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0], formatter_class=argparse.RawTextHelpFormatter)
  ap.add_argument('--reader', required=True, help='a reader config: smollm2, gemma3_270m, hf (with overrides)')
  ap.add_argument('--dataset', default='fc_sh_6k', help='a dataset config with an answer task')
  ap.add_argument('--questions', type=int, default=None, help='a seeded subset of this many questions')
  ap.add_argument('--one-at-a-time', type=int, default=8, help='prompts timed again with batch size 1')
  ap.add_argument('--batch-size', type=int, default=16)
  ap.add_argument('--timing-k', type=int, default=0, help='also time prompts of k items (a retriever row)')
  ap.add_argument('--timing-prompts', type=int, default=0, help='how many such prompts to time')
  ap.add_argument('--out', default=None, help='folder for reader_compare_<reader>_<dataset>.json')
  ap.add_argument('overrides', nargs='*', help='further Hydra overrides, e.g. reader.threads=2')
  a = ap.parse_args(argv)
  res = compare(
    a.reader,
    a.dataset,
    questions=a.questions,
    one_at_a_time=a.one_at_a_time,
    batch_size=a.batch_size,
    overrides=a.overrides,
    timing_k=a.timing_k,
    timing_prompts=a.timing_prompts,
  )
  print(summary(res))
  if a.out:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f'reader_compare_{a.reader}_{a.dataset}.json').write_text(json.dumps(res, indent=1) + '\n')


if __name__ == '__main__':
  main()
