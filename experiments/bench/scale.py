"""Scale: operator cost versus episode size N (one synthetic episode per N).

Per size N (``--scale-n``, default 1e3, 3e3, 1e4, 3e4, 1e5 items) one synthetic episode
(:func:`engram_jax.testing.synthetic.scale_episode`: D = 384; ``--scale-queries`` questions, 64; texts from a Zipf
vocabulary) and, per operator of ``--scale-ops`` (cosine, bm25, rrf = RRF of cosine and BM25, cfs, cfsr, tide, with
the knob values of :func:`experiments.bench.operators.operator_options`), the jitted top-10 of
:func:`engram_jax.eval.pipeline.pipeline_topk` -- the evaluation's path -- timed after compile and warm-up in ``--rounds``
rounds (at least 3) by :func:`time_scale`. Each line: N, ms per query (median (min-max) over rounds), XLA's static
peak memory of the compiled call (arguments + temps + outputs) and its temps; then per operator the growth exponent
(least-squares slope of log time against log N) and the check at N = ``--check-n`` (1e3): identical top-10 ids from
the scale path (the episode padded past ``GRAM_ITEMS``, so that CFS / CFS-R take their branch without an N x N
Gram) and from the ordinary one. Text operators are skipped, with the reason, where the episode arrays would hold a
dense ``[N, V]`` term-count matrix above ``--dense-budget-gb``.

    python -m experiments.bench --scale --out outputs/scale.md       # cost vs episode size N, 1e3 .. 1e5
    python -m experiments.bench --scale --scale-n 1000,3000,10000 --rounds 3 --scale-ops cosine,cfsr
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

from engram_jax.core import batch
from engram_jax.core.types import Episode, Item, Question
from engram_jax.eval import pipeline
from engram_jax.ops import OPERATORS
from engram_jax.ops import bm25 as bm25_ops
from engram_jax.ops import greedy as greedy_ops
from engram_jax.testing.synthetic import EmbeddedEpisode, scale_episode
from experiments.bench.common import cell, spread, thread_settings, time_jax
from experiments.bench.operators import FUSION, operator_options

SCALE_NS = (1_000, 3_000, 10_000, 30_000, 100_000)
SCALE_OPS = ('cosine', 'bm25', 'rrf', 'cfs', 'cfsr', 'tide')
SCALE_RRF = {'cos': {'op': 'cosine'}, 'bm25': {'op': 'bm25'}}  # conf/pipeline/rrf_cos_bm25.yaml
TEXT_OPS = ('bm25', 'mem0')  # operators that read the texts (besides a Tide with a BM25 base)
CHECK_N = 1_000  # where the scale path is checked against the ordinary one
TOP_K = 10


def scale_pipelines(
  names: Sequence[str] = SCALE_OPS, overrides: Mapping[str, Mapping[str, Any]] | None = None
) -> dict[str, pipeline.Pipeline]:
  """The pipeline each scale row runs: a registered operator alone with the bench's knob values
  (:func:`operator_options`: Tide pool 50 / recency 0.1, CFS pool 50), or :data:`FUSION` = RRF of cosine and BM25
  (``rrf_cos_bm25``: depth 10 each, k0 60).

  Raises:
    ValueError: an unknown name or an invalid knob value.
  """
  out = {}
  for name in names:
    if name == FUSION:
      legs = {leg: {**node, **operator_options(node['op'], overrides)} for leg, node in SCALE_RRF.items()}
      out[name] = pipeline.make_pipeline(name=name, fusion='rrf', legs=legs)
    elif name in OPERATORS:
      out[name] = pipeline.make_pipeline(name=name, legs={name: {'op': name, **operator_options(name, overrides)}})
    else:
      raise ValueError(f'unknown scale op {name!r}; choose from {sorted(OPERATORS) + [FUSION]}')
  return out


def reads_text(pipe: pipeline.Pipeline) -> bool:
  """Whether a pipeline reads the texts (a BM25 leg, or an operator built on BM25), not only the embeddings."""
  return any(
    leg.op in TEXT_OPS
    or bool(leg.operator.needs is not None and leg.operator.needs(dict(leg.options)).get('tokenizers'))
    or dict(leg.options).get('base') == 'bm25'
    for leg in pipe.legs
  )


class TermLayout(NamedTuple):
  """How :func:`engram_jax.core.batch.episode_arrays` stores BM25 term counts, read off a one-item probe."""

  dense: bool  # a dense ``doc_tf [N, V]`` array (else a sparse layout, whose size does not grow with N x V)
  itemsize: int  # bytes per dense entry (0 when not dense)


def term_layout() -> TermLayout:
  """Probe the episode arrays' BM25 representation: dense ``[N, V]`` (then the scale table caps BM25's N) or not."""
  probe = Episode(
    id='probe',
    items=(Item(id='a', text='w', parent='p', position=0),),
    questions=(Question(id='q', text='w', gold=('a',), gold_parents=('p',), category=0),),
  )
  unit = np.full((1, 4), 0.5, np.float32)  # unit-norm rows (episode_arrays refuses others)
  arr = batch.episode_arrays(probe, unit, unit)
  tf = getattr(arr, 'doc_tf', None)
  dense = isinstance(tf, (np.ndarray, jax.Array)) and tf.ndim == 2 and tf.shape[0] == arr.docs.shape[0]
  return TermLayout(dense, int(tf.dtype.itemsize) if dense else 0)


def dense_term_bytes(b: EmbeddedEpisode, layout: TermLayout) -> int:
  """Bytes of the dense ``[N, V]`` term counts :func:`engram_jax.core.batch.episode_arrays` would build for ``b``, before
  padding (a lower bound): real items x distinct ``words`` tokens of the items; 0 for a sparse layout."""
  if not layout.dense:
    return 0
  vocab = set()
  for it in b.episode.items:
    vocab.update(bm25_ops.tokenize(it.text))
  return b.episode.n_items * len(vocab) * layout.itemsize


def xla_memory(compiled: Any) -> dict[str, int] | None:
  """XLA's static buffer analysis of a compiled call: ``{'args', 'temps', 'outputs', 'peak'}`` bytes (peak =
  args + temps + outputs - aliased), or None when the backend gives none."""
  try:
    m = compiled.memory_analysis()
  except (NotImplementedError, AttributeError, RuntimeError):
    return None
  if m is None:
    return None
  out = {
    'args': int(m.argument_size_in_bytes),
    'temps': int(m.temp_size_in_bytes),
    'outputs': int(m.output_size_in_bytes),
  }
  out['peak'] = out['args'] + out['temps'] + out['outputs'] - int(getattr(m, 'alias_size_in_bytes', 0))
  return out


def growth_exponent(ns: Sequence[float], times: Sequence[float]) -> float | None:
  """Least-squares slope of log(time) against log(N) (None with fewer than two sizes)."""
  if len(ns) < 2:
    return None
  return float(np.polyfit(np.log(np.asarray(ns, np.float64)), np.log(np.asarray(times, np.float64)), 1)[0])


def _topk_fn(pipe: pipeline.Pipeline) -> Callable[..., jax.Array]:
  return jax.jit(functools.partial(pipeline.pipeline_topk, pipe, k=TOP_K))


def padded_past_gram(b: EmbeddedEpisode, built: Mapping[str, Any]) -> batch.EpisodeArrays:
  """``b``'s arrays padded to more than :data:`engram_jax.ops.greedy.GRAM_ITEMS` items (masked), by the N bucket
  multiple: ``N - 1`` pads to ``2 (N - 1)`` whether the bucket rounds small sizes to the multiple or to a power of
  two; ``GRAM_ITEMS + 1`` where that is not enough.

  Raises:
    ValueError: when neither pads past the threshold (an episode of at most ``GRAM_ITEMS / 2 + 1`` items under a
      power-of-two bucket).
  """
  n = b.episode.n_items
  for multiple in (max(n - 1, 1), greedy_ops.GRAM_ITEMS + 1):
    arr = batch.episode_arrays(b.episode, b.docs, b.queries, n_multiple=multiple, **built)
    if arr.docs.shape[0] > greedy_ops.GRAM_ITEMS:
      return arr
  raise ValueError(
    f'cannot pad {n} items past GRAM_ITEMS={greedy_ops.GRAM_ITEMS}; check at N >= {greedy_ops.GRAM_ITEMS // 2 + 2}'
  )


def check_scale_path(
  pipes: Mapping[str, pipeline.Pipeline], *, n_items: int = CHECK_N, n_queries: int = 64, dim: int = 384, seed: int = 0
) -> dict[str, tuple[int, int]]:
  """Top-10 ids of the scale path against the ordinary one, per pipeline, on one episode of ``n_items`` items.

  Ordinary: :func:`engram_jax.eval.pipeline.pipeline_topk` on :func:`engram_jax.core.batch.episode_arrays` with its default
  padding, as ``experiments.evaluate`` runs it (at ``n_items <= GRAM_ITEMS`` the pool operators gather their blocks
  from the episode Gram). Scale path: the same episode padded past :data:`engram_jax.ops.greedy.GRAM_ITEMS`
  (masked items), so that CFS / CFS-R / MMR take their large-N branch (per-query blocks from the pooled rows, no
  N x N Gram), as every size above the threshold does.

  Returns ``{name: (questions with identical top-10 ids, questions)}``.
  """
  b = scale_episode(n_items, n_queries, dim=dim, seed=seed)
  built = pipeline.build_options(pipes.values())
  plain = batch.episode_arrays(b.episode, b.docs, b.queries, **built)
  past = padded_past_gram(b, built)
  key = jax.random.key(seed)
  out = {}
  for name, pipe in pipes.items():
    fn = _topk_fn(pipe)
    want = np.asarray(fn(plain, key))[:n_queries]
    got = np.asarray(fn(past, key))[:n_queries]
    out[name] = (int(np.sum(np.all(got == want, axis=-1))), n_queries)
  return out


def time_scale(
  ns: Sequence[int] = SCALE_NS,
  names: Sequence[str] = SCALE_OPS,
  *,
  n_queries: int = 64,
  dim: int = 384,
  rounds: int = 5,
  repeats: int = 3,
  dense_budget_gb: float = 1.0,
  overrides: Mapping[str, Mapping[str, Any]] | None = None,
  check_n: int | None = CHECK_N,
  seed: int = 0,
  log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
  """Operator cost versus episode size: for each N in ``ns`` one :func:`scale_episode`, and for each pipeline of
  :func:`scale_pipelines` the jitted top-10 of all its questions (:func:`engram_jax.eval.pipeline.pipeline_topk`, the
  evaluation's path: legs, fusion, cut).

  Per N: the episode is padded (:func:`engram_jax.core.batch.episode_arrays`, default buckets) and put on the device;
  every pipeline is compiled (its XLA buffer analysis read) and warmed up; then in each of ``rounds`` rounds every
  pipeline is timed (``repeats`` calls, median; the order reversed in odd rounds). Time per query = the call's time
  / ``n_queries``; per-episode work (the CFS / CFS-R Gram at N <= GRAM_ITEMS, BM25's statistics) is shared by the
  ``n_queries`` questions. Padded questions are computed too, so ``n_queries`` should be a bucket size (64).

  Memory: a pipeline that reads texts is skipped at an N where the episode arrays hold a dense ``[N, V]``
  term-count matrix above ``dense_budget_gb`` (its size computed from N and the vocabulary); the other pipelines
  then run on a text-free copy of the episode (same embeddings), whose term counts are empty.

  Returns:
    ``{'rows': [...], 'ops': {name: {'exponent', 'fit_ns', 'exponent_large'}}, 'check': {name: (equal, checked)} or
    None, 'check_n', 'n_queries', 'dim', 'rounds', 'repeats', 'layout', 'options'}`` (``exponent_large``: the fit
    over the sizes padded past GRAM_ITEMS only); a row has ``op``, ``n``, ``n_pad``, ``per_query_rounds`` (seconds per
    query, one per round), ``per_query`` (their median), ``memory`` (:func:`xla_memory`) and ``skipped`` (why, or
    None).
  """
  pipes = scale_pipelines(names, overrides)
  layout = term_layout()
  budget = dense_budget_gb * 2**30
  text = {name: reads_text(p) for name, p in pipes.items()}
  key = jax.random.key(seed)
  rows = []
  for n in ns:
    b = scale_episode(n, n_queries, dim=dim, seed=seed)
    need = dense_term_bytes(b, layout)
    too_big = need > budget
    if too_big:
      b = scale_episode(n, n_queries, dim=dim, seed=seed, texts=False)
    arr = jax.device_put(
      batch.episode_arrays(
        b.episode,
        b.docs,
        b.queries,
        **pipeline.build_options([p for name, p in pipes.items() if not (too_big and text[name])]),
      )
    )
    prepared = {}
    for name, pipe in pipes.items():
      row = {
        'op': name,
        'n': n,
        'n_pad': int(arr.docs.shape[0]),
        'per_query_rounds': [],
        'per_query': None,
        'memory': None,
        'skipped': None,
      }
      rows.append(row)
      if too_big and text[name]:
        row['skipped'] = f'dense [N, V] term counts would need {need / 2**30:.1f} GB (> {dense_budget_gb:g} GB)'
        continue
      compiled = _topk_fn(pipe).lower(arr, key).compile()
      row['memory'] = xla_memory(compiled)
      thunk = functools.partial(compiled, arr, key)
      jax.block_until_ready(thunk())  # warm-up
      prepared[name] = (row, thunk)
    if log is not None:
      log(
        f'N={n} (padded {arr.docs.shape[0]}): compiled {list(prepared)}'
        + (f'; dense [N, V] {need / 2**30:.2f} GB' if layout.dense else '')
      )
    order = list(prepared)
    for r in range(max(int(rounds), 1)):
      for name in order if r % 2 == 0 else order[::-1]:
        row, thunk = prepared[name]
        t, _ = time_jax(thunk, repeats)
        row['per_query_rounds'].append(t / n_queries)
    for row, _ in prepared.values():
      row['per_query'] = spread(row['per_query_rounds'])['median']
    del arr, prepared
  ops = {}
  for name in pipes:
    done = [r for r in rows if r['op'] == name and r['per_query'] is not None]
    big = [r for r in done if r['n_pad'] > greedy_ops.GRAM_ITEMS]
    ops[name] = {
      'exponent': growth_exponent([r['n'] for r in done], [r['per_query'] for r in done]),
      'fit_ns': [r['n'] for r in done],
      'exponent_large': growth_exponent([r['n'] for r in big], [r['per_query'] for r in big]),
    }
  check = None
  if check_n is not None:
    check = check_scale_path(pipes, n_items=check_n, n_queries=n_queries, dim=dim, seed=seed)
    if log is not None:
      log(f'checked the scale path at N={check_n}')
  return {
    'rows': rows,
    'ops': ops,
    'check': check,
    'check_n': check_n,
    'n_queries': n_queries,
    'dim': dim,
    'rounds': max(int(rounds), 1),
    'repeats': repeats,
    'layout': layout._asdict(),
    'options': {name: {leg.name: dict(leg.options) for leg in p.legs} for name, p in pipes.items()},
  }


def _mb(x: int | None) -> str:
  return 'n/a' if x is None else f'{x / 2**20:.1f}'


def format_scale(result: Mapping[str, Any], *, threads: str | None = None) -> str:
  """Markdown: one line per operator and N (time per query, median (min-max) over rounds; XLA peak memory), then
  one line per operator (growth exponent, the check at ``check_n``), with the thread settings under them."""
  lines = [
    f'Scale: one synthetic episode per N (D={result["dim"]}, {result["n_queries"]} questions, top-{TOP_K} '
    f'by engram_jax.eval.pipeline.pipeline_topk, jitted); ms per query = one call over all questions / questions, '
    f'median (min-max) over {result["rounds"]} rounds of the median of {result["repeats"]} calls, after '
    'compile and warm-up. Memory: XLA peak = static buffer analysis of the compiled call '
    '(arguments + temps + outputs, MB; arguments include the [N, D] embeddings); host RSS is not shown.',
    '',
    '| op | N | N padded | ms / query | XLA peak MB | temps MB |',
    '|---|---:|---:|---:|---:|---:|',
  ]
  for r in result['rows']:
    if r['skipped']:
      lines.append(f'| {r["op"]} | {r["n"]} | {r["n_pad"]} | skipped: {r["skipped"]} | | |')
      continue
    m = r['memory'] or {}
    lines.append(
      f'| {r["op"]} | {r["n"]} | {r["n_pad"]} | {cell(r["per_query_rounds"], 1e3, "{:.3f}")} | '
      f'{_mb(m.get("peak"))} | {_mb(m.get("temps"))} |'
    )
  check = result.get('check')
  at = f'at N={result["check_n"]}' if check else '(not checked)'
  lines += [
    '',
    f'| op | growth exponent | N fitted | exponent, N > {greedy_ops.GRAM_ITEMS} | top-{TOP_K} equal {at} |',
    '|---|---:|---|---:|---:|',
  ]
  fmt = lambda e: 'n/a' if e is None else f'{e:.2f}'
  for name, o in result['ops'].items():
    eq = 'n/a' if not check or name not in check else f'{check[name][0]}/{check[name][1]}'
    lines.append(
      f'| {name} | {fmt(o["exponent"])} | {", ".join(str(n) for n in o["fit_ns"])} | '
      f'{fmt(o["exponent_large"])} | {eq} |'
    )
  lines += [
    '',
    '- growth exponent: least-squares slope of log(ms / query) against log(N) over the sizes measured; '
    f'"N > {greedy_ops.GRAM_ITEMS}": over the sizes above the Gram threshold only (at or below it CFS / '
    'CFS-R compute the N x N episode Gram once per episode, a per-episode cost shared by the questions).',
    f'- top-{TOP_K} equal: questions whose ids from the scale path (the episode padded past '
    f'GRAM_ITEMS={greedy_ops.GRAM_ITEMS}, so CFS / CFS-R compute per-query pool blocks, no N x N Gram) equal '
    'those of the ordinary path (default padding, as experiments.evaluate; Gram gathered).',
    '- options: ' + '; '.join(f'{n}: {o}' for n, o in result['options'].items()),
    threads if threads is not None else thread_settings(),
  ]
  return '\n'.join(lines)
