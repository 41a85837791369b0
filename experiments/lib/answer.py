"""Tier 1 inside ``experiments.evaluate``: the ``reader`` config group (none | smollm2 | gemma3_270m | hf) answers from each
pipeline's top-k on the same questions as Tier 0 (engram_jax.answer.tier1 does the work).

    python -m experiments.evaluate dataset=fc_sh_6k reader=smollm2 pipeline=[cosine,bm25]

``reader=none`` (the default) does nothing: results.json is that of a retrieval run.
"""

from __future__ import annotations

import logging
import resource
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from engram_jax.answer import cache as answer_cache
from engram_jax.answer import tier1
from engram_jax.eval.evaluation import EvalResult

log = logging.getLogger(__name__)


def enabled(cfg: DictConfig) -> bool:
  return bool(cfg.get('reader')) and cfg.reader.get('name', 'none') != 'none'


def peak_rss_mib() -> float:
  """Peak resident memory of this process (MiB; Linux reports KiB)."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Tier1:
  """The run's reader (loaded on first use) and what it did, for run_info.json."""

  def __init__(self, cfg: DictConfig, settings: Any):
    self.cfg = cfg
    self.settings = settings  # the run's typed eval node (engram_jax.eval.config.EvalConfig)
    self.reader = None
    self.info: dict[str, Any] = {'datasets': {}}

  def get_reader(self):
    """The reader; for a packaged reader (``smollm2``, ``gemma3_270m``) a stand-in whose spec needs only the GGUF's
    hash, so that a run whose answers are all cached never loads the model."""
    if self.reader is None:
      from engram_jax.answer import reader as reader_lib

      if str(self.cfg.reader.name) in reader_lib.PACKAGED:
        self.reader = LazyPackaged(self)
      else:
        self.load()
    return self.reader

  def load(self):
    if self.reader is None or isinstance(self.reader, LazyPackaged):
      from engram_jax.answer import reader as reader_lib

      r = self.cfg.reader
      self.reader, load = reader_lib.load_reader(
        str(r.name),
        model=r.get('model'),
        device=str(r.get('device', 'cpu')),
        dtype=str(r.get('dtype', 'float32')),
        batch_size=int(r.get('batch_size', 16)),
        cache_dir=self.cfg.paths.cache_dir,
        threads=r.get('threads'),
        prompt=r.get('prompt'),
        gguf_file=r.get('gguf_file'),
      )
      self.info['load'] = {
        'source': load.source,
        'seconds': load.seconds,
        'dequantised_now': load.dequantised_now,
        'folder': load.folder,
        'peak_rss_mib_after_load': peak_rss_mib(),
      }
      log.info('reader %s loaded in %.1f s', load.source, load.seconds)
    return self.reader

  def run(
    self, ds: DictConfig, episodes, result: EvalResult, *, labels: dict[str, str] | None = None
  ) -> tuple[dict[str, Any], str]:
    """Tier 1 on dataset ``ds``: every pipeline of ``result`` plus oracle and no-context."""
    spec = ds.get('answer')
    if spec is None:
      raise ValueError(
        f'dataset {ds.name} declares no answer task (dataset.answer.task); Tier 1 needs one: {list(tier1.TASKS)}'
      )
    task = str(spec.task)
    max_new = self.cfg.reader.get('max_new_tokens') or spec.max_new_tokens
    reader = self.get_reader()
    by_ep = {e.id: e for e in episodes}
    qs = {q.id: q for e in episodes for q in e.questions}
    questions = [(by_ep[e], qs[q]) for q, e in zip(result.question_ids, result.episode_ids)]
    keep = subset(result.question_ids, self.cfg.reader.get('questions'), seed=int(self.cfg.seed))
    questions = [questions[i] for i in keep]
    retrieved = {n: [ids[i] for i in keep] for n, ids in result.retrieved.items()}
    cache = answer_cache.AnswerCache(Path(self.cfg.paths.cache_dir) / 'answers', reader.spec(int(max_new)))
    stats_box: list[tier1.AnswerStats] = []

    def answer(prompts):
      replies, st = tier1.answer_all(
        prompts,
        reader,
        cache,
        max_new_tokens=int(max_new),
        progress=self.settings.progress,
        desc=f'answering {ds.name}',
        longest_first=bool(self.cfg.reader.get('longest_first', False)),
      )
      stats_box.append(st)
      return replies

    metric0 = list(ds.metrics)[0]
    tier0 = {n: result.scores[n][metric0][keep] for n in result.scores if metric0 in result.scores[n]}
    more = {n: {m: v[keep] for m, v in result.scores[n].items() if m != metric0} for n in result.scores}
    baselines = [b for b in self.cfg.reader.get('baselines', ['bm25', 'cosine'])]
    t0 = time.perf_counter()
    t1 = tier1.run_tier1(
      task,
      questions,
      retrieved,
      answer,
      k=int(result.k),
      seed=int(self.cfg.seed),
      n_resamples=self.settings.n_resamples,
      baselines=baselines,
      tier0=tier0,
      tier0_metric=metric0,
      tier0_more=more,
    )
    st = stats_box[0]
    t1['reader'] = reader.spec(int(max_new))
    t1['subset'] = None if len(keep) == len(result.question_ids) else {'n': len(keep), 'seed': int(self.cfg.seed)}
    self.info['datasets'][ds.name] = {
      'prompts': st.prompts,
      'unique_prompts': st.unique,
      'cached': st.cached,
      'generated': st.generated,
      'generation_seconds': st.seconds,
      'answers_per_second': st.answers_per_second,
      'batch_size': reader.batch_size,
      'tier1_seconds': time.perf_counter() - t0,
      'peak_rss_mib': peak_rss_mib(),
    }
    return t1, tier1.markdown(t1, title=str(ds.name), labels=labels)


class LazyPackaged:
  """A packaged reader's spec from its GGUF's sha256 (no model load); the model is loaded on the first
  ``generate``."""

  def __init__(self, owner: Tier1):
    from engram_jax.answer import reader as reader_lib

    r = owner.cfg.reader
    self.owner = owner
    self.name = str(r.name)
    self.batch_size = int(r.get('batch_size', 16))
    self.fingerprint = 'gguf-sha256:' + reader_lib.packaged_sha256(self.name)
    self.dtype, self.device = str(r.get('dtype', 'float32')), str(r.get('device', 'cpu'))
    self.prompt = str(r.get('prompt') or reader_lib.PACKAGED[self.name].prompt)

  def spec(self, max_new_tokens: int) -> dict[str, Any]:
    from engram_jax.answer import reader as reader_lib

    return reader_lib.reader_spec(self.name, self.fingerprint, self.dtype, self.device, self.prompt, max_new_tokens)

  def generate(self, prompts, *, max_new_tokens: int) -> list[str]:
    real = self.owner.load()
    if real.spec(max_new_tokens) != self.spec(max_new_tokens):
      raise RuntimeError(f'the loaded {self.name} does not match the spec its answers are cached under')
    return real.generate(prompts, max_new_tokens=max_new_tokens)


def subset(question_ids: list[str], n: int | None, *, seed: int) -> list[int]:
  """Indices of the questions Tier 1 answers: all (``n`` None), else ``n`` drawn with ``random.Random(seed)`` from
  the sorted question ids (the same questions for every row; a larger ``n`` need not contain a smaller one's)."""
  if n is None:
    return list(range(len(question_ids)))
  import random

  if not 1 <= int(n) <= len(question_ids):
    raise ValueError(f'reader.questions must be in 1..{len(question_ids)} (or null: all), got {n}')
  chosen = set(random.Random(seed).sample(sorted(question_ids), int(n)))
  return [i for i, q in enumerate(question_ids) if q in chosen]


def labels_for(cfg: DictConfig) -> dict[str, str]:
  """Row labels: the pipeline given fitted parameters (``fitted=...``) is marked ``(fitted)``."""
  if not cfg.get('fitted'):
    return {}
  import json

  name = json.loads(Path(cfg.fitted).read_text())['pipeline']
  return {name: f'{name} (fitted)'}
