"""Time and memory of the CFS-R twin's gradient modes on LoCoMo pools: unrolled reverse, forward-in-lambda, implicit.

    python -m experiments.research.cfsr_grad_bench [--batch 128] [--iterations 80] [--repeats 5] [--out FILE.json]

One fit step's worth of work: the cosine top-150 pools (and Gram blocks) of ``--batch`` LoCoMo questions (the fit's
minibatch; all-MiniLM-L6-v2 embeddings from the shared cache), the CFS-R twin's scores and the gradient of a fixed
linear loss in (lam, w) -- and, for the modes that have one, in the pool cosines ``b`` (what a query adapter
needs). Reported per mode: seconds per gradient (median of ``--repeats`` after a warm-up), XLA's compiled
temporary memory (``memory_analysis().temp_size_in_bytes``: the peak scratch of the step, stored iterates
included), and the relative error of its lam-gradient against unrolling to convergence (``--converged``
iterations).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from hydra import compose, initialize_config_dir

from engram_jax.eval import pipeline
from engram_jax.ops import cfsr, pools, registry
from experiments import fit as fit_exp

ROOT = Path(__file__).resolve().parents[2]


def locomo_pools(n: int, pool: int, seed: int) -> dict[str, np.ndarray]:
  """The cosine pools of ``n`` LoCoMo questions drawn with ``seed`` (every conversation, padded to one N)."""
  with initialize_config_dir(str(ROOT / 'conf'), version_base=None):
    cfg = compose('fit', overrides=['pipeline=[cfsr]'])
  pipe = fit_exp.common.hand_set_pipeline('cfsr', cfg.pipeline['cfsr'])
  episodes, _, arrays = fit_exp.prepare(cfg, pipeline.build_options([pipe]))
  n_pad = max(a.docs.shape[0] for a in arrays)
  rows = [pools.cosine_pool_rows(a, len(e.questions), n_pad, pool) for e, a in zip(episodes, arrays)]
  cat = {k: np.concatenate([r[k] for r in rows]) for k in ('pool_cos', 'pool_gram', 'pool_valid')}
  pick = np.random.default_rng(seed).choice(len(cat['pool_cos']), size=n, replace=False)
  return {k: v[pick] for k, v in cat.items()}


def grad_fn(mode: str, iterations: int, batch_size: int | None, wrt_b: bool):
  def loss(lam, w, b, g, valid, weights):
    s = cfsr.cfsr_pool_scores(
      b, g, valid=valid, lam=lam, w=w, iterations=iterations, batch_size=batch_size, lam_grad=mode
    )
    return jnp.sum(jnp.where(valid, s, 0.0) * weights)

  return jax.jit(jax.grad(loss, argnums=(0, 1, 2) if wrt_b else (0, 1)))


def bench(
  data: dict, *, iterations: int, converged: int, repeats: int, batch_size: int | None, lam: float, dtype=jnp.float32
) -> dict:
  b = jnp.asarray(data['pool_cos'], dtype)
  g = jnp.asarray(data['pool_gram'], dtype)
  valid = jnp.asarray(data['pool_valid'])
  weights = jnp.asarray(np.random.default_rng(0).normal(size=b.shape), dtype)
  w = float(registry.get('cfsr').knob('w').default)
  args = (jnp.asarray(lam, dtype), jnp.asarray(w, dtype), b, g, valid, weights)
  ref = grad_fn('reverse', converged, batch_size, False)(*args)
  out = {}
  for mode in ('reverse', 'forward', 'implicit'):
    for wrt_b in (False, True) if mode != 'forward' else (False,):
      f = grad_fn(mode, iterations, batch_size, wrt_b)
      mem = f.lower(*args).compile().memory_analysis()
      jax.block_until_ready(f(*args))
      times = []
      for _ in range(repeats):
        t0 = time.perf_counter()
        res = jax.block_until_ready(f(*args))
        times.append(time.perf_counter() - t0)
      rel = [float(abs(res[i] - ref[i]) / max(abs(ref[i]), 1e-12)) for i in (0, 1)]
      out[f'{mode}{" +b" if wrt_b else ""}'] = {
        'seconds': float(np.median(times)),
        'temp_mbytes': mem.temp_size_in_bytes / 2**20 if mem else None,
        'grad_lam': float(res[0]),
        'grad_w': float(res[1]),
        'rel_err_lam_vs_converged': rel[0],
        'rel_err_w_vs_converged': rel[1],
      }
  imp = grad_fn('implicit', converged, batch_size, False)(*args)
  out['converged'] = {
    'iterations': converged,
    'reverse_grad_lam': float(ref[0]),
    'reverse_grad_w': float(ref[1]),
    'implicit_grad_lam': float(imp[0]),
    'implicit_grad_w': float(imp[1]),
    'rel_err_lam': float(abs(imp[0] - ref[0]) / max(abs(ref[0]), 1e-12)),
    'rel_err_w': float(abs(imp[1] - ref[1]) / max(abs(ref[1]), 1e-12)),
  }
  return out


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument('--batch', type=int, default=128)
  ap.add_argument('--pool', type=int, default=150)
  ap.add_argument('--iterations', type=int, default=80)
  ap.add_argument('--converged', type=int, default=3000)
  ap.add_argument('--repeats', type=int, default=5)
  ap.add_argument('--solve-batch', type=int, default=8)
  ap.add_argument('--seed', type=int, default=20261008)
  ap.add_argument('--lam', type=float, default=None, help="ridge weight (default: the cfsr operator's declared lam)")
  ap.add_argument('--x64', action='store_true', help='float64 (the fit runs float32)')
  ap.add_argument('--out', type=Path)
  a = ap.parse_args(argv)
  if a.lam is None:
    a.lam = float(registry.get('cfsr').knob('lam').default)
  if a.x64:
    jax.config.update('jax_enable_x64', True)
  data = locomo_pools(a.batch, a.pool, a.seed)
  res = {
    'batch': a.batch,
    'pool': a.pool,
    'iterations': a.iterations,
    'solve_batch': a.solve_batch,
    'lam': a.lam,
    'x64': a.x64,
    'backend': jax.default_backend(),
    'load': os.getloadavg(),
    'modes': bench(
      data,
      iterations=a.iterations,
      converged=a.converged,
      repeats=a.repeats,
      batch_size=a.solve_batch,
      lam=a.lam,
      dtype=jnp.float64 if a.x64 else jnp.float32,
    ),
  }
  for name, r in res['modes'].items():
    if 'seconds' in r:
      print(
        f'{name:14s} {r["seconds"] * 1e3:9.1f} ms  temp {r["temp_mbytes"]:8.1f} MiB  d/dlam {r["grad_lam"]:+.5g} '
        f'(rel err vs {a.converged}-step unrolled {r["rel_err_lam_vs_converged"]:.2e})  d/dw {r["grad_w"]:+.5g} '
        f'({r["rel_err_w_vs_converged"]:.2e})'
      )
  c = res['modes']['converged']
  print(
    f'at {c["iterations"]} steps: implicit vs unrolled rel err d/dlam {c["rel_err_lam"]:.2e}, d/dw {c["rel_err_w"]:.2e}'
  )
  print(f'load average {res["load"]}')
  if a.out:
    a.out.write_text(json.dumps(res, indent=1))
  return res


if __name__ == '__main__':
  main()
