"""Protocols fixed in advance (``conf/protocol/<name>.yaml``) and the ledger of their scored confirmations.

A protocol names, for one benchmark, the pipeline, every knob to fit, the optimiser, steps, temperatures, splits,
seeds, the primary metric and the hand-set rows it is compared against (a ``# @package _global_`` overlay of
``conf/fit.yaml``, selected with ``+protocol=<name>``). It must be committed, unmodified, before its confirmation
run; the run records the file's SHA-256 in ``results.json`` and appends a line to the ledger
(``conf/protocol/scored.jsonl``, committed with the results). A second scoring of the same protocol file is
refused unless ``protocol_force=true``, and a forced run is marked as such in its results and in the ledger.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

ROOT = Path(__file__).resolve().parents[2]
PROTOCOL_DIR = ROOT / 'conf' / 'protocol'
LEDGER = PROTOCOL_DIR / 'scored.jsonl'


def protocol_path(name: str, protocol_dir: Path = PROTOCOL_DIR) -> Path:
  path = Path(protocol_dir) / f'{name}.yaml'
  if not path.is_file():
    known = sorted(p.stem for p in Path(protocol_dir).glob('*.yaml'))
    raise ValueError(f'Unknown protocol {name!r}; known: {known}')
  return path


def _rel(path: Path) -> str:
  return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def sha256(path: Path) -> str:
  return hashlib.sha256(path.read_bytes()).hexdigest()


def committed_unmodified(path: Path) -> bool | None:
  """True when ``path`` is tracked by git and equal to HEAD; None when this is not a git checkout."""
  try:
    tracked = subprocess.run(['git', 'ls-files', '--error-unmatch', str(path)], cwd=ROOT, capture_output=True,
                             check=False)
    if tracked.returncode == 128 and b'not a git repository' in tracked.stderr:
      return None
    if tracked.returncode != 0:
      return False
    return subprocess.run(['git', 'diff', '--quiet', 'HEAD', '--', str(path)], cwd=ROOT, check=False).returncode == 0
  except FileNotFoundError:
    return None


def scorings(name: str, digest: str, ledger: Path = LEDGER) -> list[dict[str, Any]]:
  """The ledger's earlier scorings of protocol ``name`` with this file hash."""
  if not ledger.is_file():
    return []
  rows = [json.loads(line) for line in ledger.read_text(encoding='utf-8').splitlines() if line.strip()]
  return [r for r in rows if r['protocol'] == name and r['sha256'] == digest]


def check(cfg: DictConfig, ledger: Path = LEDGER, protocol_dir: Path = PROTOCOL_DIR) -> dict[str, Any] | None:
  """The run's protocol record, or None when no protocol is selected.

  Raises:
    ValueError: when the protocol file is not committed unmodified, or was already scored, and
      ``protocol_force`` is not set.
  """
  name = cfg.get('protocol_name')
  if not name:
    return None
  ledger = Path(cfg.get('protocol_ledger') or ledger)
  path = protocol_path(str(name), protocol_dir)
  digest = sha256(path)
  force = bool(cfg.get('protocol_force', False))
  committed = committed_unmodified(path)
  earlier = scorings(str(name), digest, ledger)
  if committed is False and not force:
    raise ValueError(f'protocol {name}: {_rel(path)} is not committed (or differs from HEAD); commit '
                     'it before its confirmation run (protocol_force=true runs it anyway, marked as forced)')
  if earlier and not force:
    raise ValueError(f'protocol {name} (sha256 {digest[:12]}) was already scored on {earlier[0]["date"]} '
                     f'(run {earlier[0]["run_dir"]}); a confirmation is made once (protocol_force=true reruns it, '
                     'marked as forced)')
  return {'name': str(name), 'file': _rel(path), 'sha256': digest, 'committed': committed,
          'primary_metric': cfg.get('primary_metric'), 'ledger': str(ledger),
          'earlier_scorings': len(earlier), 'forced': force and (bool(earlier) or committed is False)}


def record(info: dict[str, Any], out_dir: Path, *, summary: dict[str, Any], paired: dict[str, Any],
           n_questions: int, ledger: Path | None = None) -> None:
  """Append this scoring to the ledger (one JSON line; ``info['ledger']`` unless ``ledger``)."""
  ledger = Path(ledger or info.get('ledger') or LEDGER)
  row = {'protocol': info['name'], 'sha256': info['sha256'], 'forced': info['forced'],
         'date': datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
         'run_dir': _rel(Path(out_dir).resolve()), 'n_questions': n_questions, 'summary': summary, 'paired': paired}
  ledger.parent.mkdir(parents=True, exist_ok=True)
  with ledger.open('a', encoding='utf-8') as f:
    f.write(json.dumps(row) + '\n')
