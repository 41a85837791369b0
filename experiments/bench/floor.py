"""CFS-R against its arithmetic floor (LoCoMo): the full leg, its parts, and the solver's batched matvecs alone.

python -m experiments.bench --cfsr-floor                      # LoCoMo (MiniLM, cached)
python -m experiments.bench --cfsr-floor --cfsr-batch 32 --episodes 3
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from engram_jax.core import batch
from engram_jax.testing.synthetic import EmbeddedEpisode
from experiments.bench.common import time_jax


def cfsr_floor(
  episodes: Sequence[EmbeddedEpisode],
  *,
  repeats: int = 5,
  batch_size: int = 16,
  pool: int = 150,
  iterations: int = 80,
  power_iterations: int = 20,
) -> dict[str, Any]:
  """Times, over all ``episodes`` (after warm-up, median of ``repeats``):

  * ``leg``: the CFS-R leg as the evaluation runs it (cosine, top-P pool, Gram blocks, projected gradient);
  * ``pool``: its pool step alone (cosine, top-P, the P x P blocks gathered from the episode Gram);
  * ``solve``: the solver alone on the gathered blocks (``power_iterations`` + ``iterations`` batched P x P
    matvecs per query, in chunks of ``batch_size`` queries, the leg's chunking);
  * ``gemm``: a dense matmul of the same FLOP count, for this machine's compute rate.

  FLOPs: ``2 P^2 (iterations + power_iterations)`` per query (the matvecs; everything else is O(P)). Bytes: each
  matvec reads its P x P float32 block, so the solver moves ``4 P^2`` bytes per 2 P^2 FLOPs (0.5 FLOP/byte):
  memory-bound unless a chunk's blocks stay in cache across the iterations.
  """
  from engram_jax.ops import cfsr as cfsr_ops

  arrays = [batch.episode_arrays(b.episode, b.docs, b.queries) for b in episodes]
  n_queries = sum(len(b.episode.questions) for b in episodes)
  leg = jax.jit(
    lambda a: cfsr_ops.cfsr_leg(a, jax.random.key(0), pool=pool, iterations=iterations, batch_size=batch_size)
  )

  def pool_blocks(a):
    gram = a.docs @ a.docs.T

    def one(q):
      _, idx, valid, g = cfsr_ops.cosine_pool(q, a.docs, a.where, gram, pool=pool)
      return g, (a.docs @ q)[idx], valid

    return jax.lax.map(one, a.queries, batch_size=batch_size)

  pools = jax.jit(pool_blocks)
  solve = jax.jit(
    lambda g, b, v: cfsr_ops.nnls_ridge_pg(
      g, b, lam=0.005, iterations=iterations, valid=v, power_iterations=power_iterations
    )
  )
  chunked = jax.jit(lambda g, b, v: jax.lax.map(lambda x: solve(*x), (g, b, v), batch_size=batch_size))
  blocks = [jax.block_until_ready(pools(a)) for a in arrays]
  p_eff = min(pool, arrays[0].docs.shape[0])
  flops = 2.0 * p_eff**2 * (iterations + power_iterations) * n_queries
  side = int(round((flops / 2) ** (1 / 3)))
  x = jnp.ones((side, side), jnp.float32)
  gemm = jax.jit(lambda m: m @ m)
  parts = {
    'leg': [lambda a=a: leg(a) for a in arrays],
    'pool': [lambda a=a: pools(a) for a in arrays],
    'solve': [lambda g=g: chunked(*g) for g in blocks],
    'gemm': [lambda: gemm(x)],
  }
  times = {}
  for name, fns in parts.items():
    for f in fns:
      jax.block_until_ready(f())  # compile and warm up
    times[name] = sum(time_jax(f, repeats)[0] for f in fns)
  return {
    'n_queries': n_queries,
    'pool': p_eff,
    'iterations': iterations,
    'power_iterations': power_iterations,
    'batch_size': batch_size,
    'gflop': flops / 1e9,
    'solver_gbytes': 2 * flops / 1e9,
    'seconds': times,
    'gemm_gflops': flops / 1e9 / times['gemm'],
  }


def format_cfsr_floor(r: Mapping[str, Any]) -> str:
  t = r['seconds']
  lines = [
    f'CFS-R on {r["n_queries"]} queries: pool P={r["pool"]}, {r["power_iterations"]} power + '
    f'{r["iterations"]} projected-gradient steps, chunks of {r["batch_size"]} queries',
    f'solver arithmetic {r["gflop"]:.1f} GFLOP, {r["solver_gbytes"]:.1f} GB of P x P block reads (float32)',
    '',
    '| part | seconds | GFLOP/s | GB/s of block reads |',
    '|---|---|---|---|',
  ]
  for name in ('leg', 'pool', 'solve', 'gemm'):
    rate = r['gflop'] / t[name] if name in ('leg', 'solve', 'gemm') else None
    bw = r['solver_gbytes'] / t[name] if name in ('leg', 'solve') else None
    lines.append(
      f'| {name} | {t[name]:.3f} | {"" if rate is None else f"{rate:.1f}"} | {"" if bw is None else f"{bw:.1f}"} |'
    )
  lines.append(
    f"\nfloor at this machine's dense-matmul rate: {r['gflop'] / r['gemm_gflops']:.3f} s; the leg is "
    f'{t["leg"] / (r["gflop"] / r["gemm_gflops"]):.1f}x that'
  )
  return '\n'.join(lines)
