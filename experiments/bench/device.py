"""GPU readiness: the default run, CFS-R and the fit's step, timed on the default device and compared per question
with the CPU.

    python -m experiments.bench --device-check                         # LoCoMo; the CPU recomputed in-process
    python -m experiments.bench --device-check --out cpu.npz           # on a CPU machine: write the reference
    python -m experiments.bench --device-check --reference cpu.npz     # on the GPU machine: compare with it
    python -m experiments.bench --device-check --data synthetic --episodes 2 --queries 16   # a dry run, seconds

What is run, on the first ``--episodes`` episodes (each padded by :func:`engram_jax.core.batch.episode_arrays`):

* ``default``: the default pipelines of ``conf/config.yaml`` (cosine, bm25, rrf_cos_bm25), each episode's top-10
  (:func:`engram_jax.eval.pipeline.pipeline_topk`), one jitted call per episode;
* ``cfsr``: the CFS-R leg (declared defaults), its top-10 ids and their scores per question;
* ``fit step``: one jitted training step of :mod:`engram_jax.fit` (soft ``rrf_cos_bm25_cfsr``, its CFS-R ``lam``
  and ``w``, Adam, a seeded minibatch of 128 questions): the loss and the updated knobs.

Each part is compiled and warmed up, then timed (median of ``--repeats`` calls, summed over episodes). The
comparison: per question, whether the top-10 ids equal the reference's, and the largest score difference over the
reference's top-10; for the fit step, the relative difference of the loss and of the updated knobs. Without
``--reference``, the reference is the same computation on ``jax.devices('cpu')[0]`` in this process (on a
CPU-only machine that is a dry run of the script: the default device is that CPU). Tolerances: float32 on both
sides; a GPU may sum in another order (and XLA's default matmul precision on recent NVIDIA GPUs is TF32 unless
``--precision highest``), so ids may differ on near-ties: the table reports the counts rather than failing.

On a device machine without network access, carry what LoCoMo needs: the data root (``ENGRAM_DATA_ROOT``, 2.7 MB)
and the embedding cache (``ENGRAM_CACHE_DIR``: MiniLM and LoCoMo's vectors, 37 MB here), or pass ``--data
synthetic``. Not yet run on a GPU (none was lent to issue 30): the budget of under 5 minutes is an estimate (two
passes, each compiling the three pipelines, CFS-R and a fit step per episode shape bucket).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from engram_jax.core import batch
from engram_jax.eval import pipeline
from engram_jax.ops import OPERATORS
from engram_jax.testing.synthetic import EmbeddedEpisode
from experiments.bench.common import time_jax

DEFAULT_PIPELINES = ('cosine', 'bm25', 'rrf_cos_bm25')  # conf/config.yaml's default pipeline group
FIT_PIPELINE = 'rrf_cos_bm25_cfsr'
FIT_PARAMS = ('legs.cfsr.lam', 'legs.cfsr.w')
FIT_BATCH = 128
TOP = 10


def _pipelines() -> dict[str, pipeline.Pipeline]:
  from experiments.lib.common import hand_set_pipeline

  return {name: hand_set_pipeline(name) for name in (*DEFAULT_PIPELINES, FIT_PIPELINE)}


def run_parts(
  episodes: Sequence[EmbeddedEpisode], *, device: jax.Device | None = None, repeats: int = 3, seed: int = 0
) -> tuple[dict[str, np.ndarray], dict[str, float]]:
  """Run (and time) the three parts on ``device`` (None: the default device).

  Returns:
    ``(results, seconds)``: ``results`` maps ``default/<pipeline>/<episode>`` to top-10 ids ``[Q, 10]``,
    ``cfsr/<episode>/ids`` and ``/scores`` to the CFS-R leg's top-10 ids and scores ``[Q, 10]`` (real questions
    only), ``fit/loss`` to the step's loss and ``fit/<path>`` to each updated unconstrained knob; ``seconds`` maps
    each part to its time (median of ``repeats`` warm calls, summed over episodes).
  """
  import optax

  from engram_jax import fit
  from engram_jax.fit import train

  pipes = _pipelines()
  built = pipeline.build_options(pipes.values())
  ctx = jax.default_device(device) if device is not None else contextlib.nullcontext()
  results: dict[str, np.ndarray] = {}
  seconds = {'default': 0.0, 'cfsr': 0.0, 'fit step': 0.0}
  key = jax.random.key(seed)
  with ctx:
    arrays = [batch.episode_arrays(b.episode, b.docs, b.queries, **built) for b in episodes]
    arrays = [jax.device_put(a, device) if device is not None else a for a in arrays]
    topk = {n: jax.jit(lambda a, p=pipes[n]: pipeline.pipeline_topk(p, a, key, k=TOP)) for n in DEFAULT_PIPELINES}
    cfsr_leg = jax.jit(lambda a: OPERATORS['cfsr'].leg(a, key))
    for e, (b, arr) in enumerate(zip(episodes, arrays)):
      q = len(b.episode.questions)
      for name, fn in topk.items():
        jax.block_until_ready(fn(arr))
        t, out = time_jax(lambda fn=fn, arr=arr: fn(arr), repeats)
        seconds['default'] += t
        results[f'default/{name}/{e}'] = np.asarray(out)[:q]
      jax.block_until_ready(cfsr_leg(arr))
      t, s = time_jax(lambda arr=arr: cfsr_leg(arr), repeats)
      seconds['cfsr'] += t
      s = np.asarray(s)[:q]
      ids = np.argsort(-s, axis=-1, kind='stable')[:, :TOP]
      results[f'cfsr/{e}/ids'] = ids
      results[f'cfsr/{e}/scores'] = np.take_along_axis(s, ids, axis=-1)

    problem, knobs, every = fit.make_problem(pipes[FIT_PIPELINE], list(FIT_PARAMS))
    rows = fit.build_rows(problem, pipes[FIT_PIPELINE], [b.episode for b in episodes], arrays, seed=seed)
    optimizer = optax.adam(0.05)
    grouped = train.group_optimizer(optimizer)  # the fit's own optimizer layout (no components)
    step = train.make_step(problem, grouped, max_gold=train.max_gold_of(rows))
    params = {train.KNOBS: dict(knobs.raw)}
    state = train.TrainState(params=params, opt_state=grouped.init(params), step=jnp.zeros((), jnp.int32))
    fixed = {p: jnp.asarray(v, jnp.float32) for p, v in every.items()}
    idx, weight = train.minibatch(np.random.default_rng(seed), np.arange(rows.where.shape[0]), FIT_BATCH)
    call = lambda: step(state, fixed, rows, {}, jnp.asarray(idx), jnp.asarray(weight), jnp.float32(1.0))
    jax.block_until_ready(call())
    t, (new_state, loss) = time_jax(call, repeats)
    seconds['fit step'] = t
    results['fit/loss'] = np.asarray(loss)
    for p, v in new_state.params[train.KNOBS].items():
      results[f'fit/{p}'] = np.asarray(v)
  return results, seconds


def compare(got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray]) -> dict[str, dict[str, Any]]:
  """Per part: questions, questions whose top-10 ids equal the reference's, the largest score difference over the
  reference's top-10 (CFS-R), the largest relative difference of the fit step's loss and knobs."""
  missing = sorted(set(want) - set(got))
  if missing:
    raise ValueError(f'the reference has results this run lacks (other episodes or parts?): {missing[:5]}')
  out: dict[str, dict[str, Any]] = {
    'default': {'questions': 0, 'same_ids': 0, 'max_diff': None},
    'cfsr': {'questions': 0, 'same_ids': 0, 'max_diff': 0.0},
    'fit step': {'questions': None, 'same_ids': None, 'max_diff': 0.0},
  }
  for name, w in want.items():
    g = got[name]
    if name.startswith('default/') or name.endswith('/ids'):
      part = out['default' if name.startswith('default/') else 'cfsr']
      part['questions'] += w.shape[0]
      part['same_ids'] += int(np.all(g == w, axis=-1).sum())
    elif name.endswith('/scores'):
      out['cfsr']['max_diff'] = max(out['cfsr']['max_diff'], float(np.max(np.abs(g - w), initial=0.0)))
    else:
      rel = float(np.max(np.abs(g - w) / np.maximum(np.abs(w), 1e-12)))
      out['fit step']['max_diff'] = max(out['fit step']['max_diff'], rel)
  return out


def device_check(
  episodes: Sequence[EmbeddedEpisode],
  *,
  repeats: int = 3,
  reference: Mapping[str, np.ndarray] | None = None,
  reference_seconds: Mapping[str, float] | None = None,
  log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
  """Run the parts on the default device and compare them with ``reference`` (else recomputed on the CPU)."""
  device = jax.devices()[0]
  t0 = time.perf_counter()
  got, seconds = run_parts(episodes, repeats=repeats)
  if log is not None:
    log(f'{device.platform}: parts done in {time.perf_counter() - t0:.1f} s')
  ref_seconds = dict(reference_seconds or {})
  if reference is None:
    reference, ref_seconds = run_parts(episodes, device=jax.devices('cpu')[0], repeats=repeats)
  return {
    'device': f'{device.platform}:{device.id} ({device.device_kind})',
    'questions': sum(len(b.episode.questions) for b in episodes),
    'seconds': seconds,
    'reference_seconds': ref_seconds,
    'comparison': compare(got, reference),
    'results': got,
    'wall_s': time.perf_counter() - t0,
  }


def format_device_check(r: Mapping[str, Any]) -> str:
  lines = [
    f'device check on {r["device"]}: {r["questions"]} questions, {r["wall_s"]:.1f} s wall (compilation included)',
    '| part | device ms | CPU reference ms | questions | same top-10 ids | max difference |',
    '|---|---:|---:|---:|---:|---:|',
  ]
  for part, c in r['comparison'].items():
    ref_t = r['reference_seconds'].get(part)
    diff = 'n/a' if c['max_diff'] is None else f'{c["max_diff"]:.3g}'
    lines.append(
      f'| {part} | {r["seconds"][part] * 1e3:.1f} | {"n/a" if ref_t is None else f"{ref_t * 1e3:.1f}"} | '
      f'{c["questions"] if c["questions"] is not None else "128 (one step)"} | '
      f'{"n/a" if c["same_ids"] is None else c["same_ids"]} | {diff} |'
    )
  lines.append(
    'max difference: CFS-R scores over the reference top-10 (absolute); fit step: loss and updated knobs (relative)'
  )
  return '\n'.join(lines)


def save(path: str, r: Mapping[str, Any]) -> None:
  """Write a run's results and times (a reference for ``--reference`` on another machine)."""
  arrays = {f'result:{k}': v for k, v in r['results'].items()}
  arrays.update({f'seconds:{k}': np.asarray(v) for k, v in r['seconds'].items()})
  np.savez(path, **arrays)


def load(path: str) -> tuple[dict[str, np.ndarray], dict[str, float]]:
  with np.load(path) as z:
    results = {k.split(':', 1)[1]: z[k] for k in z.files if k.startswith('result:')}
    seconds = {k.split(':', 1)[1]: float(z[k]) for k in z.files if k.startswith('seconds:')}
  return results, seconds
