"""The bench's command line: four tools behind one set of flags.

    python -m experiments.bench                       # operator timing: 10 synthetic LoCoMo-sized episodes
    python -m experiments.bench --episodes 2 --repeats 2 --rounds 3 --ops cosine,cfsr,rrf
    python -m experiments.bench --ops bm25        # BM25 vs rank_bm25 and bm25s (pip install "engram_jax[bench]")
    python -m experiments.bench --ops bm25_lucene_exact   # Lucene's BM25 on the English analyzer vs bm25s's lucene
    python -m experiments.bench --data locomo         # the real LoCoMo episodes (MiniLM, cached)
    python -m experiments.bench --ref-queries 0       # time the references on every query (slow)
    python -m experiments.bench --set tide.pool=10    # change one operator's knob
    python -m experiments.bench --ops-modules mypkg.myop --ops myop   # an out-of-tree operator
    python -m experiments.bench --harness             # the whole default evaluation run: wall / retrieve
    python -m experiments.bench --scale --out outputs/scale.md       # cost vs episode size N, 1e3 .. 1e5
    python -m experiments.bench --scale --scale-n 1000,3000,10000 --rounds 3 --scale-ops cosine,cfsr
    python -m experiments.bench --cfsr-floor          # LoCoMo: the CFS-R leg against its arithmetic floor
    python -m experiments.bench --device-check        # GPU readiness: default run, CFS-R, fit step vs the CPU
    python -m experiments.bench --encode --out outputs/encode.md   # embedders' texts/s, GFLOP/s, options vs today

Each tool is one module: operator timing :mod:`experiments.bench.operators` (JAX vs the NumPy references and
the BM25 peers, interleaved rounds), the harness :mod:`experiments.bench.harness`, the scale table
:mod:`experiments.bench.scale`, the CFS-R floor :mod:`experiments.bench.floor`, the device check :mod:`experiments.bench.device`, encoding speed
:mod:`experiments.bench.encode`; their docstrings say what is timed and how.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engram_jax.core import modules
from engram_jax.ops import OPERATORS
from engram_jax.testing.synthetic import synthetic_episodes
from experiments.bench import device, encode, floor, harness, operators, scale
from experiments.bench.common import environment, locomo_episodes, parse_sets
from experiments.bench.operators import FUSION, ROWS


def parser() -> argparse.ArgumentParser:
  """The bench's command line (every tool's flags)."""
  ap = argparse.ArgumentParser(
    prog='python -m experiments.bench', description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  ap.add_argument('--data', choices=('synthetic', 'locomo'), default='synthetic')
  ap.add_argument('--root', default=None, help='data root for --data locomo')
  ap.add_argument('--cache-dir', default='.cache', help='embedding cache for --data locomo')
  ap.add_argument('--episodes', type=int, default=10, help='synthetic episodes (or the first E of LoCoMo)')
  ap.add_argument('--queries', type=int, default=200, help='synthetic queries per episode')
  ap.add_argument('--repeats', type=int, default=5, help='JAX calls per operator, episode and round (median)')
  ap.add_argument(
    '--rounds',
    type=int,
    default=5,
    help='interleaved rounds (JAX and reference back to back); the table gives the median and min-max over rounds',
  )
  ap.add_argument('--no-peers', action='store_true', help='skip the BM25 peers (rank_bm25, bm25s)')
  ap.add_argument(
    '--cpu-devices',
    default='cores',
    help="CPU devices (one per core: 'cores', or a count); with more than one, the operator table adds a column "
    "timing every episode's call at once, the episodes split over the devices as evaluation splits them",
  )
  ap.add_argument(
    '--ref-queries',
    type=int,
    default=40,
    help='reference-timed queries per episode (0: all), time scaled to all queries',
  )
  ap.add_argument(
    '--cfsr-batch',
    type=int,
    default=None,
    help='batch_size knob of every operator that has one (the CFS-R family); 0: vmap all queries; '
    "default: the declarations' default",
  )
  ap.add_argument(
    '--ops',
    default=None,
    help=f'comma-separated operator names, named rows ({", ".join(ROWS)}) and/or {FUSION!r} (default: every '
    'registered operator, the named rows, then rrf)',
  )
  ap.add_argument('--ops-modules', default='', help='comma-separated modules to import first (they register operators)')
  ap.add_argument(
    '--set',
    action='append',
    default=[],
    metavar='OP.KNOB=VALUE',
    help='a knob value over the bench defaults (repeatable; OP: an operator or a named row)',
  )
  ap.add_argument(
    '--cfsr-floor',
    action='store_true',
    help='LoCoMo: the CFS-R leg against its arithmetic floor (pool step, solver alone, dense-matmul rate)',
  )
  ap.add_argument(
    '--device-check',
    action='store_true',
    help='GPU readiness: the default pipelines, CFS-R and a fit step timed on the default device and compared per '
    'question with the CPU (--reference FILE: a CPU run written with --out FILE; else recomputed here on the CPU)',
  )
  ap.add_argument('--reference', default=None, help='--device-check: the CPU results to compare with (.npz)')
  ap.add_argument(
    '--precision',
    choices=('default', 'high', 'highest'),
    default='default',
    help="--device-check: jax_default_matmul_precision ('highest': float32 matmuls on GPU, not TF32)",
  )
  ap.add_argument(
    '--scale',
    action='store_true',
    help='the scale table instead: operator cost versus episode size N (one synthetic episode per N)',
  )
  ap.add_argument('--scale-n', default=','.join(str(n) for n in scale.SCALE_NS), help='comma-separated episode sizes N')
  ap.add_argument(
    '--scale-queries',
    type=int,
    default=64,
    help='questions per scale episode (a multiple of 64, the Q bucket, wastes nothing)',
  )
  ap.add_argument(
    '--scale-ops',
    default=','.join(scale.SCALE_OPS),
    help=f'comma-separated operator names and/or {FUSION!r} (RRF of cosine and BM25)',
  )
  ap.add_argument(
    '--dense-budget-gb',
    type=float,
    default=1.0,
    help='skip text operators where dense [N, V] term counts would exceed this',
  )
  ap.add_argument('--check-n', type=int, default=scale.CHECK_N, help='N of the scale-path check (0: none)')
  ap.add_argument(
    '--out', default=None, help='also write the scale table (Markdown) here, and its rows as JSON beside it'
  )
  ap.add_argument(
    '--encode',
    action='store_true',
    help="encoding speed instead: texts/s and GFLOP/s of the embedders, today's path and each option (interleaved "
    "rounds), with max |diff| of each option's vectors from today's (--out: the table and its JSON)",
  )
  ap.add_argument('--encode-models', default=','.join(encode.MODELS), help='comma-separated: minilm, mpnet')
  ap.add_argument(
    '--encode-paths',
    default=','.join(encode.DEFAULT_PATHS),
    help=f'comma-separated paths (torch first) of {", ".join(encode.PATHS)}',
  )
  ap.add_argument('--encode-texts', type=int, default=512, help='LoCoMo texts encoded per round (0: all 7,852)')
  ap.add_argument(
    '--harness',
    nargs='*',
    default=None,
    metavar='OVERRIDE',
    help='time the whole evaluation path instead (experiments.evaluate with these Hydra overrides; '
    'none: the default LoCoMo job), --rounds times; prints the overhead ratio wall / retrieve',
  )
  return ap


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]] | dict[str, Any]:
  """Run the tool the flags select; returns its rows (the scale table: its result dict)."""
  ap = parser()
  args = ap.parse_args(argv)
  use_cpu_devices(args.cpu_devices, ap)
  if args.cfsr_floor:
    print('\n'.join(environment()))
    result = floor.cfsr_floor(
      locomo_episodes(args.root, cache_dir=args.cache_dir)[: args.episodes],
      repeats=args.repeats,
      batch_size=args.cfsr_batch or OPERATORS['cfsr'].defaults['batch_size'],
    )
    print(floor.format_cfsr_floor(result))
    return [result]
  if args.device_check:
    return device_main(args)
  if args.encode:
    return encode_main(args, ap)
  if args.harness is not None:
    print('\n'.join(environment()))
    rows = harness.harness(args.harness, rounds=max(args.rounds, 2))
    print(harness.format_harness(rows))
    return rows
  modules.import_modules(list(filter(None, args.ops_modules.split(','))), '--ops-modules')
  if args.scale:
    return scale_main(args, ap)
  names = None if args.ops is None else [o for o in args.ops.split(',') if o]
  if names is not None:
    unknown = sorted(set(names) - set(OPERATORS) - set(ROWS) - {FUSION})
    if unknown:
      ap.error(f'unknown ops {unknown}; choose from {sorted(OPERATORS) + list(ROWS) + [FUSION]}')
  try:
    overrides = parse_sets(args.set)
  except ValueError as e:
    ap.error(str(e))
  if set(overrides) - set(OPERATORS) - set(ROWS):
    ap.error(
      f'--set names unknown operators {sorted(set(overrides) - set(OPERATORS) - set(ROWS))}; choose from '
      f'{sorted(OPERATORS) + list(ROWS)}'
    )
  if args.cfsr_batch is not None:
    for name, op in OPERATORS.items():
      if any(k.name == 'batch_size' for k in op.knobs):
        overrides.setdefault(name, {}).setdefault('batch_size', args.cfsr_batch or None)
  print('\n'.join(environment()))
  if args.data == 'synthetic':
    episodes = synthetic_episodes(n_episodes=args.episodes, n_queries=args.queries)
  else:
    episodes = locomo_episodes(args.root, cache_dir=args.cache_dir)[: args.episodes]
  print(f'{len(episodes)} {args.data} episodes', file=sys.stderr)
  rows = operators.time_operators(
    episodes,
    names,
    repeats=args.repeats,
    rounds=args.rounds,
    ref_queries=args.ref_queries,
    overrides=overrides,
    peers=not args.no_peers,
    log=lambda s: print(s, file=sys.stderr),
    devices=all_devices(),
  )
  print(
    operators.format_table(rows, n_episodes=len(episodes), n_queries=sum(len(b.episode.questions) for b in episodes))
  )
  return rows


def use_cpu_devices(value: str, ap: argparse.ArgumentParser) -> None:
  """Give the process ``value`` CPU devices (``'cores'``: one per core) before its first computation
  (:func:`experiments.lib.common.set_cpu_devices`)."""
  from experiments.lib.common import cpu_devices_wanted, set_cpu_devices

  try:
    n = cpu_devices_wanted('cores' if value == 'cores' else int(value), os.cpu_count())
  except ValueError as e:
    ap.error(f"--cpu-devices must be 'cores' or an integer >= 1: {e}")
  set_cpu_devices(n)


def all_devices() -> list[Any]:
  """This process's devices of the default backend."""
  import jax

  return list(jax.devices())


def scale_main(args: argparse.Namespace, ap: argparse.ArgumentParser) -> dict[str, Any]:
  """``--scale``: time, print and optionally write (``--out``) the scale table."""
  try:
    ns = [int(float(n)) for n in args.scale_n.split(',') if n]
    names = [o for o in args.scale_ops.split(',') if o]
    overrides = parse_sets(args.set)
    scale.scale_pipelines(names, overrides)  # validates names and knob values
  except ValueError as e:
    ap.error(str(e))
  print('\n'.join(environment()))
  result = scale.time_scale(
    ns,
    names,
    n_queries=args.scale_queries,
    rounds=max(args.rounds, 3),
    repeats=args.repeats,
    dense_budget_gb=args.dense_budget_gb,
    overrides=overrides,
    check_n=args.check_n or None,
    log=lambda s: print(s, file=sys.stderr),
  )
  table = scale.format_scale(result)
  print(table)
  if args.out:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text('\n'.join(environment()) + '\n\n' + table + '\n')
    out.with_suffix('.json').write_text(json.dumps(result, indent=1, default=str))
  return result


def device_main(args: argparse.Namespace) -> dict[str, Any]:
  """``--device-check``: run, print and optionally write (``--out``) the device check."""
  import jax

  print('\n'.join(environment()))
  if args.data == 'synthetic':
    episodes = synthetic_episodes(n_episodes=args.episodes, n_queries=args.queries)
  else:
    episodes = locomo_episodes(args.root, cache_dir=args.cache_dir)[: args.episodes]
  reference, ref_seconds = device.load(args.reference) if args.reference else (None, None)
  with jax.default_matmul_precision(None if args.precision == 'default' else args.precision):
    result = device.device_check(
      episodes,
      repeats=args.repeats,
      reference=reference,
      reference_seconds=ref_seconds,
      log=lambda s: print(s, file=sys.stderr),
    )
  print(device.format_device_check(result))
  if args.out:
    device.save(args.out, result)
  return result


def encode_main(args: argparse.Namespace, ap: argparse.ArgumentParser) -> dict[str, Any]:
  """``--encode``: time, print and optionally write (``--out``) the encoding table."""
  models = [m for m in args.encode_models.split(',') if m]
  paths = [p for p in args.encode_paths.split(',') if p]
  bad = sorted(set(models) - set(encode.MODELS)) + sorted(set(paths) - set(encode.PATHS))
  if bad:
    ap.error(f'unknown --encode-models/--encode-paths {bad}; models {list(encode.MODELS)}, paths {list(encode.PATHS)}')
  texts = encode.sample_texts(args.encode_texts, args.root)
  print('\n'.join(environment()))
  result = encode.time_encoders(
    models, paths, texts, rounds=args.rounds, cache_dir=args.cache_dir, log=lambda s: print(s, file=sys.stderr)
  )
  table = encode.format_encode(result)
  print(table)
  if args.out:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    load = ', '.join(f'{x:.2f}' for x in os.getloadavg())
    out.write_text('\n'.join(environment()) + f'\nload average at the end: {load}\n\n' + table + '\n')
    out.with_suffix('.json').write_text(json.dumps({**result, 'load_average_end': os.getloadavg()}, indent=1))
  return result
