"""The whole evaluation path, timed: ``experiments.evaluate.run`` on the default config (+ Hydra overrides) in
rounds; prints each phase, the XLA compilations and the overhead ratio wall / retrieve.

    python -m experiments.bench --harness                                # the default LoCoMo job, 5 rounds
    python -m experiments.bench --harness dataset=longmemeval_s --rounds 3
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def harness(overrides: Sequence[str], *, rounds: int, out_dir: str | None = None) -> list[dict[str, Any]]:
  """The whole evaluation path, timed: ``experiments.evaluate.run`` on ``conf/config.yaml`` + ``overrides``,
  ``rounds`` times in this process (the first round warms the embedding and compilation caches).

  Returns one row per round: end-to-end wall time of ``run`` (config checks, loading, embedding through the
  cache, retrieval, metrics, statistics, report files), the time inside the jitted retrieval calls (``retrieve``,
  compilation included), the XLA compilations and the overhead ratio ``wall / retrieve``.
  """
  import tempfile

  from hydra import compose, initialize_config_dir

  from experiments import evaluate

  conf = str(Path(__file__).resolve().parents[2] / 'conf')
  with initialize_config_dir(config_dir=conf, version_base='1.3'):
    cfg = compose(config_name='config', overrides=['eval.progress=false', *overrides])
  rows = []
  for r in range(rounds):
    folder = Path(out_dir or tempfile.mkdtemp(prefix='engram_harness_')) / f'round{r}'
    t0 = time.perf_counter()
    evaluate.run(cfg, folder)
    wall = time.perf_counter() - t0
    t = json.loads((folder / 'run_info.json').read_text())['timing']
    retrieve = t['phases_s'].get('retrieve', 0.0)
    rows.append(
      {
        'round': r,
        'wall_s': wall,
        'retrieve_s': retrieve,
        'phases_s': t['phases_s'],
        'xla_compilations': t['xla_compilations'],
        'overhead_ratio': wall / retrieve if retrieve else None,
      }
    )
  return rows


def format_harness(rows: Sequence[Mapping[str, Any]]) -> str:
  phases = list(rows[0]['phases_s'])
  head = ['round', 'wall s', *[f'{p} s' for p in phases], 'XLA compilations', 'overhead ratio (wall / retrieve)']
  lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
  for r in rows:
    ratio = f'{r["overhead_ratio"]:.2f}' if r['overhead_ratio'] else 'n/a'
    lines.append(
      f'| {r["round"]} | {r["wall_s"]:.2f} | '
      + ' | '.join(f'{r["phases_s"][p]:.2f}' for p in phases)
      + f' | {r["xla_compilations"]} | {ratio} |'
    )
  warm = [r['overhead_ratio'] for r in rows[1:] if r['overhead_ratio']]
  if warm:
    lines.append(f'\nwarm rounds: median overhead ratio {statistics.median(warm):.2f} (round 0 warms the caches)')
  return '\n'.join(lines)
