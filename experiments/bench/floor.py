"""CFS-R against its arithmetic floor (LoCoMo): the full leg, its parts, and the solver's batched matvecs alone.

python -m experiments.bench --cfsr-floor                      # LoCoMo (MiniLM, cached)
python -m experiments.bench --cfsr-floor --cfsr-batch 32 --episodes 3
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from threadpoolctl import threadpool_limits

from engram_jax.core import batch, ranking
from engram_jax.testing.synthetic import EmbeddedEpisode
from experiments.bench.common import time_jax


def cfsr_floor(
  episodes: Sequence[EmbeddedEpisode],
  *,
  repeats: int = 5,
  batch_size: int = 8,
  pool: int = 150,
  iterations: int = 80,
  power_iterations: int = 20,
) -> dict[str, Any]:
  """Times, over all ``episodes`` (after warm-up, median of ``repeats``):

  * ``leg``: the CFS-R leg as the evaluation runs it (cosine, top-P pool, Gram blocks, projected gradient, blend);
  * ``pool``: its pool step alone (:func:`engram_jax.ops.cfsr.cfsr_prepare`: cosine, top-P, the P x P blocks
    gathered from the episode Gram), and ``pool: top-P`` without the block gather (the gather is the difference);
  * ``power``: the solver's power iterations alone (:func:`engram_jax.ops.nnls.power_lmax`); ``solve``: the solver
    (``power_iterations`` + ``iterations`` batched P x P matvecs per query, in chunks of ``batch_size`` queries, the
    leg's chunking);
    projected gradient = solve - power; blend + scatter = leg - pool - solve;
  * ``gemm``: a dense matmul of the same FLOP count, for this machine's compute rate;
  * ``blas``: the solver's matvecs without XLA: the same blocks in the same chunks, ``power_iterations +
    iterations`` batched matvecs each (``numpy.matmul`` on a ``[batch_size, P, P]`` stack, OpenBLAS, one thread),
    for the rate a hand-tuned kernel reads cached blocks at on one core (a Python call per matvec included, about a
    tenth of it);
  * ``read``: the solver's block reads alone, through XLA's fused reduce: each chunk's blocks summed along their rows
    ``power_iterations + iterations`` times (one fused add-and-reduce per pass, made to depend on the pass before so
    that it is not hoisted), the same bytes in the same chunks as the solve, for this machine's rate of reading
    blocks that stay in a core's cache.

  Like the leg, the parts skip chunks of padded questions only (``map_live_queries``): they run on the first
  ``ceil(Q_real / batch_size)`` chunks of each episode.

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

  pools = jax.jit(lambda a: cfsr_ops.cfsr_prepare(a, None, pool=pool, batch_size=batch_size))

  def top_only(a):
    def one(q, d, wh, g):
      del g
      cos = d @ q
      idx, _ = ranking.top_k(cos, k=min(pool, d.shape[0]), where=wh)
      return cos[idx], idx

    return cfsr_ops.map_live_queries(one, a.queries, a.docs, a.where, None, live=a.query_where, batch_size=batch_size)

  tops = jax.jit(top_only)

  def solver(its):
    one = lambda g, b, v: cfsr_ops.nnls_ridge_pg(
      g, b, lam=0.005, iterations=its, valid=v, power_iterations=power_iterations
    )
    return jax.jit(lambda g, b, v: jax.lax.map(lambda x: one(*x), (g, b, v), batch_size=batch_size))

  chunked = solver(iterations)
  power_one = lambda g, v: cfsr_ops.power_lmax(g, valid=v, iterations=power_iterations)
  power_only = jax.jit(lambda g, b, v: jax.lax.map(lambda x: power_one(x[0], x[2]), (g, b, v), batch_size=batch_size))

  def live_blocks(a):
    pr = jax.block_until_ready(pools(a))
    n_live = -(-int(a.query_where.sum()) // batch_size) * batch_size
    return pr['gram'][:n_live], pr['b'][:n_live], pr['valid'][:n_live]

  blocks = [live_blocks(a) for a in arrays]
  p_eff = min(pool, arrays[0].docs.shape[0])
  flops = 2.0 * p_eff**2 * (iterations + power_iterations) * n_queries
  side = int(round((flops / 2) ** (1 / 3)))
  x = jnp.ones((side, side), jnp.float32)
  gemm = jax.jit(lambda m: m @ m)
  steps = iterations + power_iterations

  def read_chunk(g):
    body = lambda _, acc: acc + jnp.sum(g + acc[..., :1, None] * 1e-30, axis=-1)
    return jax.lax.fori_loop(0, steps, body, jnp.zeros(g.shape[:-1], g.dtype))

  reads = jax.jit(lambda g: jax.lax.map(read_chunk, g, batch_size=batch_size))
  host_blocks = [np.asarray(g[0]) for g in blocks]

  def blas():
    with threadpool_limits(1):
      for g in host_blocks:
        for i in range(0, g.shape[0], batch_size):
          gc = g[i : i + batch_size]
          a = np.ones(gc.shape[:-1] + (1,), np.float32) / gc.shape[-1]
          y = np.empty_like(a)
          for _ in range(steps // 2):
            np.matmul(gc, a, out=y)
            np.matmul(gc, y, out=a)
            a /= np.abs(a).max() + 1.0  # keep the values finite (O(P) work)

  parts = {
    'leg': [lambda a=a: leg(a) for a in arrays],
    'pool': [lambda a=a: pools(a) for a in arrays],
    'pool: top-P': [lambda a=a: tops(a) for a in arrays],
    'power': [lambda g=g: power_only(*g) for g in blocks],
    'solve': [lambda g=g: chunked(*g) for g in blocks],
    'gemm': [lambda: gemm(x)],
    'read': [lambda g=g: reads(g[0]) for g in blocks],
    'blas': [blas],
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
    'devices': jax.local_device_count(),
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
  for name in ('leg', 'pool', 'pool: top-P', 'power', 'solve', 'gemm', 'read', 'blas'):
    rate = r['gflop'] / t[name] if name in ('leg', 'solve', 'gemm', 'blas') else None
    bw = r['solver_gbytes'] / t[name] if name in ('leg', 'solve', 'read', 'blas') else None
    lines.append(
      f'| {name} | {t[name]:.3f} | {"" if rate is None else f"{rate:.1f}"} | {"" if bw is None else f"{bw:.1f}"} |'
    )
  rest = t['leg'] - t['pool'] - t['solve']
  lines.append(
    f'\nprofile: pool {t["pool"]:.3f} s (top-P {t["pool: top-P"]:.3f}, block gather {t["pool"] - t["pool: top-P"]:.3f}), '
    f'power iteration {t["power"]:.3f}, projected gradient {t["solve"] - t["power"]:.3f}, blend + scatter + rest '
    f'{rest:.3f} (leg - pool - solve)'
  )
  lines.append(
    f"floor at this machine's dense-matmul rate: {r['gflop'] / r['gemm_gflops']:.3f} s; the leg is "
    f'{t["leg"] / (r["gflop"] / r["gemm_gflops"]):.1f}x that'
  )
  lines.append(
    f'the same bytes read by a fused add-and-reduce (the same chunks and passes): {t["read"]:.3f} s, '
    f'{r["solver_gbytes"] / t["read"]:.1f} GB/s; the solve reads its blocks at {r["solver_gbytes"] / t["solve"]:.1f} '
    'GB/s, as fast as XLA reads them at all (0.5 FLOP per byte: bound by the reads, not the arithmetic)'
  )
  blas_bw = r['solver_gbytes'] / t['blas']
  lines.append(
    f'OpenBLAS reads the same blocks in the same chunks at {blas_bw:.1f} GB/s on one core (numpy.matmul): at that '
    f'rate on all {r["devices"]} device(s), with nothing else in the leg, the solve alone would take '
    f"{t['blas'] / r['devices']:.3f} s, the leg's lower bound for this algorithm in float32 on this machine"
  )
  return '\n'.join(lines)
