"""Protocols fixed in advance (``conf/protocol/<name>.yaml``) and the ledger of their scored confirmations.

A protocol names, for one benchmark, the pipeline, every knob to fit, the optimiser, steps, temperatures, splits,
seeds, the primary metric and the hand-set rows it is compared against (a ``# @package _global_`` overlay of
``conf/fit.yaml``, selected with ``+protocol=<name>``). It must be committed, unmodified, before its confirmation
run; the run records the file's SHA-256 in ``results.json`` and appends a line to the ledger
(``conf/protocol/scored.jsonl``, committed with the results). The run's resolved configuration is compared with
the protocol's own (the config composed from ``+protocol=<name>`` alone): an override that changes a fixed setting
(anything but paths, progress bars, devices and the protocol switches) is refused, and the resolved configuration's
SHA-256 is recorded beside the file's. A second scoring of a protocol name that has been scored (whatever its file's
hash: a comment-only edit is the same protocol) is refused. A run from a dirty checkout (a tracked file differs from
HEAD: :func:`dirty_files`, the ledger files included, so an earlier run's row must be committed first) is refused,
naming the first files, so that a row's ``git_commit`` is the code that ran. ``protocol_force=true`` runs any of these
anyway, marked as forced (with every reason) in its results and in the ledger.

The committed ledger is always consulted for earlier scorings; ``protocol_ledger=<file>`` only adds a scratch
ledger (consulted too, and the one the run appends to). Each row records what was run: a fingerprint of the data
actually read (:func:`data_fingerprint`, every loaded episode's items and questions), the git commit and the
package versions. The data read is compared with the fingerprint pinned for the protocol's dataset settings in
``conf/protocol/data.json`` (``python -m experiments.lib.protocol pin [NAME ...]`` writes it, to be committed with
the protocol): a confirmation on changed data, or on data with no pinned fingerprint, is refused unless forced.
"""

from __future__ import annotations

import datetime
import hashlib
import importlib.metadata
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from engram_jax.core.errors import EngramError

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
PROTOCOL_DIR = ROOT / 'conf' / 'protocol'
LEDGER = PROTOCOL_DIR / 'scored.jsonl'
CONF = ROOT / 'conf'
DATA_PINS = PROTOCOL_DIR / 'data.json'
# annotations of ledger rows written after their scoring (the ledger itself is append-only: a row's numbers are never
# edited); one JSON line each: {"protocol", "row_date" (the annotated row's "date"), "kind" (NOTE_KINDS), "date", "note"}
NOTES = PROTOCOL_DIR / 'notes.jsonl'
NOTE_KINDS = ('not_reproduced', 'not_exact', 'run_dir_gone', 'clean_rerun')
# the packages whose versions a ledger row records (absent ones are recorded as None)
PACKAGES = ('jax', 'jaxlib', 'numpy', 'optax', 'flax', 'sentence-transformers', 'torch', 'transformers', 'hydra-core')
# settings that do not change what is scored (where files go, progress bars, the devices a map is sharded over:
# results do not depend on them, tested) or that are the protocol switches themselves
UNFIXED = ('paths', 'protocol_force', 'protocol_ledger', 'eval.progress', 'eval.devices', 'eval.cpu_devices')


def protocol_path(name: str, protocol_dir: Path = PROTOCOL_DIR) -> Path:
  path = Path(protocol_dir) / f'{name}.yaml'
  if not path.is_file():
    known = sorted(p.stem for p in Path(protocol_dir).glob('*.yaml'))
    raise EngramError(f'Unknown protocol {name!r}; known: {known}')
  return path


def _rel(path: Path) -> str:
  return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def run_dir_record(out_dir: Path | str, root: Path = ROOT) -> dict[str, Any]:
  """Where a ledger row says its run's files are: ``{'run_dir': path relative to the repository}`` when the run
  folder is inside it, else ``{'run_dir': absolute path, 'run_dir_outside_repo': True}`` (a folder such as /tmp/...
  is gone on another machine or after a reboot: the row's numbers stand, its files may not).

  Example:
    >>> from pathlib import Path
    >>> run_dir_record(Path('/repo/outputs/protocols/x'), root=Path('/repo'))
    {'run_dir': 'outputs/protocols/x'}
    >>> run_dir_record(Path('/tmp/x'), root=Path('/repo'))
    {'run_dir': '/tmp/x', 'run_dir_outside_repo': True}
  """
  path, root = Path(out_dir).resolve(), Path(root).resolve()
  if path.is_relative_to(root):
    return {'run_dir': str(path.relative_to(root))}
  return {'run_dir': str(path), 'run_dir_outside_repo': True}


def warn_run_dir(out_dir: Path | str, root: Path = ROOT) -> str | None:
  """A warning (logged, and returned) when a protocol run's folder is outside the repository, else None.

  Example:
    >>> from pathlib import Path
    >>> warn_run_dir(Path('/repo/outputs/x'), root=Path('/repo')) is None
    True
  """
  rec = run_dir_record(out_dir, root)
  if not rec.get('run_dir_outside_repo'):
    return None
  msg = (
    f'protocol run folder {rec["run_dir"]} is outside the repository ({Path(root).resolve()}): the ledger row will '
    'record it as run_dir_outside_repo (its files may not outlive this machine); '
    'hydra.run.dir=outputs/protocols/NAME keeps them with the checkout'
  )
  log.warning(msg)
  return msg


def sha256(path: Path) -> str:
  return hashlib.sha256(path.read_bytes()).hexdigest()


def committed_unmodified(path: Path) -> bool | None:
  """True when ``path`` is tracked by git and equal to HEAD; None when this is not a git checkout."""
  try:
    tracked = subprocess.run(
      ['git', 'ls-files', '--error-unmatch', str(path)], cwd=ROOT, capture_output=True, check=False
    )
    if tracked.returncode == 128 and b'not a git repository' in tracked.stderr:
      return None
    if tracked.returncode != 0:
      return False
    return subprocess.run(['git', 'diff', '--quiet', 'HEAD', '--', str(path)], cwd=ROOT, check=False).returncode == 0
  except FileNotFoundError:
    return None


def scorings(name: str, ledger: Path = LEDGER, committed: Path | None = LEDGER) -> list[dict[str, Any]]:
  """Earlier scorings of protocol ``name`` (any file hash: an edited protocol file is still the protocol of that
  name) in the committed ledger and in ``ledger`` (a scratch ledger adds to the committed one, never replaces it)."""
  paths = list(dict.fromkeys(Path(p).resolve() for p in (committed, ledger) if p is not None))
  rows = [r for path in paths for r in read_jsonl(path, what='ledger ')]
  return [r for r in rows if r.get('protocol') == name]


def read_jsonl(path: Path, what: str = '') -> list[dict[str, Any]]:
  """The JSON lines of ``path`` ([] when it does not exist); a bad line is an EngramError naming it (after
  ``what``, e.g. ``'ledger '``)."""
  path = Path(path)
  if not path.is_file():
    return []
  rows = []
  for i, line in enumerate(path.read_text(encoding='utf-8').splitlines()):
    if line.strip():
      try:
        rows.append(json.loads(line))
      except json.JSONDecodeError as e:
        raise EngramError(f'{what}{path} line {i + 1} is not JSON ({e}); repair it') from None
  return rows


def annotated(rows: list[dict[str, Any]], notes: list[dict[str, Any]]) -> list[dict[str, Any]]:
  """Ledger ``rows`` (copies) with each row's notes under ``'notes'`` (a note names its row by protocol and date).
  A note that names no row, or of an unknown kind, is an EngramError (a typo would hide it).

  Example:
    >>> rows = [{'protocol': 'p', 'date': '2026-12-01T10:00:00+00:00', 'summary': {}}]
    >>> note = {'protocol': 'p', 'row_date': '2026-12-01T10:00:00+00:00', 'kind': 'not_reproduced',
    ...         'date': '2026-12-02', 'note': 'a rerun gives 0.49'}
    >>> annotated(rows, [note])[0]['notes'][0]['kind']
    'not_reproduced'
  """
  out = [dict(r, notes=[]) for r in rows]
  for n in notes:
    missing = [k for k in ('protocol', 'row_date', 'kind', 'date', 'note') if k not in n]
    if missing or n['kind'] not in NOTE_KINDS:
      raise EngramError(f'ledger note {n}: needs protocol, row_date, kind (one of {list(NOTE_KINDS)}), date, note')
    hit = [r for r in out if r.get('protocol') == n['protocol'] and r.get('date') == n['row_date']]
    if not hit:
      raise EngramError(f'ledger note for {n["protocol"]} at {n["row_date"]}: no such ledger row')
    for r in hit:
      r['notes'].append(n)
  return out


def dirty_files(root: Path = ROOT) -> list[str] | None:
  """The tracked files of the checkout at ``root`` that differ from HEAD (staged or not; added, changed or deleted),
  relative to it and sorted; untracked files are not listed. None outside git. The ledger files
  (:data:`LEDGER`, :data:`NOTES`) are listed like any other: a row appended by an earlier run is committed first.

  Example:
    >>> import subprocess, tempfile
    >>> from pathlib import Path
    >>> d = Path(tempfile.mkdtemp())
    >>> git = lambda *a: subprocess.run(['git', '-c', 'user.name=t', '-c', 'user.email=t@t', '-c', 'commit.gpgsign=false',
    ...                                  *a], cwd=d, check=True, capture_output=True)
    >>> _ = git('init', '-q'); _ = (d / 'a.txt').write_text('a'); _ = git('add', 'a.txt'); _ = git('commit', '-qm', 'a')
    >>> dirty_files(d)
    []
    >>> _ = (d / 'a.txt').write_text('b'); _ = (d / 'new.txt').write_text('untracked')
    >>> dirty_files(d)
    ['a.txt']
  """
  try:
    head = subprocess.run(['git', 'rev-parse', 'HEAD'], cwd=root, capture_output=True, check=False)
    if head.returncode != 0:
      return None
    diff = subprocess.run(
      ['git', 'diff', '--name-only', '-z', 'HEAD', '--'], cwd=root, capture_output=True, text=True, check=False
    )
  except FileNotFoundError:
    return None
  if diff.returncode != 0:
    return None
  return sorted(n for n in diff.stdout.split('\0') if n)


def dirty_reason(dirty: list[str], shown: int = 3) -> str:
  """The words for a dirty checkout: how many tracked files differ from HEAD and the first ``shown`` of them.

  Example:
    >>> dirty_reason(['a.py', 'b.py', 'c.py', 'd.py'])
    'dirty checkout: 4 tracked files differ from HEAD (a.py, b.py, c.py, ...)'
  """
  more = ', ...' if len(dirty) > shown else ''
  return f'dirty checkout: {len(dirty)} tracked files differ from HEAD ({", ".join(dirty[:shown])}{more})'


def git_commit() -> str | None:
  """The checkout's HEAD commit, with ``+dirty`` when tracked files differ from it (None outside git)."""
  try:
    head = subprocess.run(['git', 'rev-parse', 'HEAD'], cwd=ROOT, capture_output=True, text=True, check=False)
    if head.returncode != 0:
      return None
    dirty = subprocess.run(['git', 'diff', '--quiet', 'HEAD'], cwd=ROOT, check=False).returncode != 0
    return head.stdout.strip() + ('+dirty' if dirty else '')
  except FileNotFoundError:
    return None


def package_versions() -> dict[str, str | None]:
  """Python's and :data:`PACKAGES`' versions (None where a package is not installed)."""
  out: dict[str, str | None] = {'python': sys.version.split()[0]}
  for name in PACKAGES:
    try:
      out[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      out[name] = None
  return out


def data_fingerprint(episodes) -> str:
  """SHA-256 of the data actually read: every episode's id, items (id, text, parent, position, time, speaker) and
  questions (id, text, gold, gold parents, category, answer, time), in load order."""
  h = hashlib.sha256()
  for e in episodes:
    h.update(json.dumps(['E', e.id]).encode())
    for it in e.items:
      h.update(json.dumps([it.id, it.text, it.parent, it.position, it.time, it.speaker], default=str).encode())
    for q in e.questions:
      h.update(
        json.dumps(
          [q.id, q.text, list(q.gold), list(q.gold_parents), q.category, q.answer, q.time], default=str
        ).encode()
      )
  return h.hexdigest()


def data_key(cfg: DictConfig | dict) -> str:
  """What selects the data a protocol reads: its dataset node (and ``fit.train`` when it trains on another part),
  without the data root; SHA-256 of their canonical JSON (the key of :data:`DATA_PINS`)."""
  node = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else json.loads(json.dumps(cfg))
  fit_node = node.get('fit') or {}
  sel = {'dataset': node.get('dataset'), 'train': fit_node.get('train') if fit_node.get('split') == 'parts' else None}
  return hashlib.sha256(json.dumps(sel, sort_keys=True, default=str).encode()).hexdigest()


def pinned_data(key: str, pins: Path = DATA_PINS) -> dict[str, Any] | None:
  if not Path(pins).is_file():
    return None
  return json.loads(Path(pins).read_text(encoding='utf-8')).get(key)


def check_data(info: dict[str, Any] | None, cfg: DictConfig, episodes, pins: Path = DATA_PINS) -> None:
  """Fingerprint the data a protocol run read (``episodes``: every scored and training episode) and compare it with
  the pinned one; refused when it differs or none is pinned, unless forced (then every reason is added to
  ``info['forced_because']``). Records ``info['data']``; no-op without a protocol."""
  if info is None:
    return
  key = data_key(cfg)
  fp = data_fingerprint(episodes)
  pin = pinned_data(key, pins)
  info['data'] = {
    'fingerprint': fp,
    'key': key,
    'pinned': (pin or {}).get('fingerprint'),
    'n_episodes': len(episodes),
    'n_questions': sum(len(e.questions) for e in episodes),
  }
  if pin is None:
    reason = f'no data fingerprint pinned for these dataset settings (key {key[:12]}) in {_rel(Path(pins))}'
  elif pin['fingerprint'] != fp:
    reason = (
      f'data changed: read {len(episodes)} episodes with fingerprint {fp[:12]}, pinned {pin["fingerprint"][:12]} '
      f'({pin.get("n_episodes")} episodes)'
    )
  else:
    return
  if not info.get('force'):
    raise EngramError(
      f'protocol {info["name"]}: {reason}; a confirmation runs on the pinned data (protocol_force=true runs it '
      'anyway, marked as forced)'
    )
  refuse_tracked_ledger(info['name'], [*info['forced_because'], reason], info.get('ledger'), cfg)
  info['forced'] = True
  info['forced_because'].append(reason)


def refuse_tracked_ledger(name: str, reasons: list[str], ledger: Path | str | None, cfg: DictConfig) -> None:
  """A forced run (``reasons``) appends to the tracked ledger :data:`LEDGER` only when ``protocol_ledger`` names it:
  left unset, a forced rerun would add a row to the committed record by default; a one-line error then asks for a
  scratch ledger."""
  if ledger is None or cfg.get('protocol_ledger') or Path(ledger).resolve() != LEDGER.resolve():
    return
  raise EngramError(
    f'protocol {name}: a forced run ({"; ".join(reasons)}) would append its row to the tracked ledger {_rel(LEDGER)}; '
    'give a scratch ledger (protocol_ledger=outputs/scratch_ledger.jsonl), or name the tracked one '
    f'(protocol_ledger={_rel(LEDGER)}) to record it there, marked as forced'
  )


def markdown_lines(info: dict[str, Any] | None) -> list[str]:
  """What a protocol run's results.md says under its title: forced (with every reason) or a confirmation; [] without
  a protocol.

  Example:
    >>> markdown_lines({'name': 'p', 'forced': True, 'forced_because': ['already scored 1x'], 'sha256': 'ab' * 32})
    ['', 'Protocol p: **forced** (already scored 1x): not a confirmation.']
  """
  if not info:
    return []
  if info.get('forced'):
    return [
      '',
      f'Protocol {info["name"]}: **forced** ({"; ".join(info.get("forced_because") or [])}): not a confirmation.',
    ]
  return ['', f'Protocol {info["name"]}: a confirmation (file sha256 {str(info.get("sha256"))[:12]}, not forced).']


def settings(cfg: DictConfig | dict) -> dict[str, Any]:
  """The resolved configuration without :data:`UNFIXED` (what a protocol fixes), as a plain dict."""
  node = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else json.loads(json.dumps(cfg))
  node.pop('hydra', None)
  for key in UNFIXED:
    *parents, last = key.split('.')
    d = node
    for p in parents:
      d = d.get(p) if isinstance(d, dict) else None
    if isinstance(d, dict):
      d.pop(last, None)
  return node


def config_sha256(cfg: DictConfig | dict) -> str:
  """SHA-256 of the resolved settings (:func:`settings`, canonical JSON)."""
  return hashlib.sha256(json.dumps(settings(cfg), sort_keys=True, default=str).encode()).hexdigest()


def changed_settings(run: dict[str, Any], fixed: dict[str, Any], prefix: str = '') -> list[str]:
  """Dotted keys whose values differ between the run's settings and the protocol's (sorted)."""
  out = []
  for key in sorted(set(run) | set(fixed), key=str):
    path = f'{prefix}{key}'
    a, b = run.get(key, '<absent>'), fixed.get(key, '<absent>')
    if isinstance(a, dict) and isinstance(b, dict):
      out += changed_settings(a, b, f'{path}.')
    elif a != b:
      out.append(path)
  return out


def fixed_config(name: str, config_name: str | None = None) -> DictConfig:
  """The protocol's own configuration: ``config_name`` (default: the running app's, else ``fit``) composed with
  ``+protocol=<name>`` and nothing else."""
  from hydra import compose, initialize_config_dir
  from hydra.core.global_hydra import GlobalHydra
  from hydra.core.hydra_config import HydraConfig

  overrides = [f'+protocol={name}']
  if config_name is None:
    config_name = HydraConfig.get().job.config_name if HydraConfig.initialized() else 'fit'
  if GlobalHydra.instance().is_initialized():  # inside a Hydra app (its search path is this repository's conf/)
    return compose(config_name=config_name, overrides=overrides)
  with initialize_config_dir(config_dir=str(CONF), version_base='1.3'):
    return compose(config_name=config_name, overrides=overrides)


def check(
  cfg: DictConfig,
  ledger: Path = LEDGER,
  protocol_dir: Path = PROTOCOL_DIR,
  fixed: DictConfig | dict | None = None,
  committed_ledger: Path | None = LEDGER,
) -> dict[str, Any] | None:
  """The run's protocol record, or None when no protocol is selected.

  ``fixed``: the protocol's own configuration (default :func:`fixed_config`), compared with ``cfg``. Earlier
  scorings are looked up in ``committed_ledger`` and in ``ledger`` (``protocol_ledger`` when set).

  Raises:
    ValueError: when the protocol file is not committed unmodified, the run's overrides change a fixed setting,
      the protocol name was already scored, or a tracked file of the checkout differs from HEAD (:func:`dirty_files`),
      and ``protocol_force`` is not set.
  """
  name = cfg.get('protocol_name')
  if not name:
    return None
  ledger = Path(cfg.get('protocol_ledger') or ledger)
  path = protocol_path(str(name), protocol_dir)
  digest = sha256(path)
  force = bool(cfg.get('protocol_force', False))
  committed = committed_unmodified(path)
  earlier = scorings(str(name), ledger, committed_ledger)
  if fixed is None:
    fixed = fixed_config(str(name))
  changed = changed_settings(settings(cfg), settings(fixed))
  dirty = dirty_files()
  if committed is False and not force:
    raise EngramError(
      f'protocol {name}: {_rel(path)} is not committed (or differs from HEAD); commit '
      'it before its confirmation run (protocol_force=true runs it anyway, marked as forced)'
    )
  if earlier and not force:
    raise EngramError(
      f'protocol {name} was already scored on {earlier[0]["date"]} (file sha256 '
      f'{earlier[0]["sha256"][:12]}, run {earlier[0]["run_dir"]}); a confirmation is made once, also '
      'after an edit of its file (protocol_force=true reruns it, marked as forced)'
    )
  if changed and not force:
    groups = list(dict.fromkeys('.'.join(c.split('.')[:2]) for c in changed))  # e.g. embedder.encoder, fit.steps
    shown = ', '.join(groups[:12]) + (f', ... ({len(groups)} in all)' if len(groups) > 12 else '')
    raise EngramError(
      f"protocol {name}: the run's overrides change settings the protocol fixes ({shown}); run "
      f'`+protocol={name}` alone (protocol_force=true runs it anyway, marked as forced)'
    )
  if dirty and not force:
    raise EngramError(
      f'protocol {name}: {dirty_reason(dirty)}; a confirmation runs committed code: commit (the ledger rows of '
      'earlier runs too) or stash first (protocol_force=true runs it anyway, marked as forced)'
    )
  reasons = (
    (
      [f'already scored {len(earlier)}x (first on {earlier[0]["date"]}, run {earlier[0]["run_dir"]})']
      if earlier
      else []
    )
    + (['file not committed unmodified'] if committed is False else [])
    + ([f'changed settings: {changed}'] if changed else [])
    + ([dirty_reason(dirty)] if dirty else [])
  )
  if force and reasons:
    refuse_tracked_ledger(str(name), reasons, ledger, cfg)
  return {
    'name': str(name),
    'file': _rel(path),
    'sha256': digest,
    'config_sha256': config_sha256(cfg),
    'committed': committed,
    'primary_metric': cfg.get('primary_metric'),
    'ledger': str(ledger),
    'earlier_scorings': len(earlier),
    'changed_settings': changed,
    'force': force,
    'forced': force and bool(reasons),
    'forced_because': reasons if force else [],
    'dirty_files': dirty or [],
    'git_commit': git_commit(),
    'packages': package_versions(),
  }


def record(
  info: dict[str, Any],
  out_dir: Path,
  *,
  summary: dict[str, Any],
  paired: dict[str, Any],
  n_questions: int,
  ledger: Path | None = None,
) -> None:
  """Append this scoring to the ledger (one JSON line; ``info['ledger']`` unless ``ledger``)."""
  ledger = Path(ledger or info.get('ledger') or LEDGER)
  row = {
    'protocol': info['name'],
    'sha256': info['sha256'],
    'config_sha256': info.get('config_sha256'),
    'forced': info['forced'],
    'forced_because': info.get('forced_because', []),
    'changed_settings': info.get('changed_settings', []),
    'data': info.get('data'),
    'git_commit': info.get('git_commit'),
    'packages': info.get('packages'),
    'date': datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
    **run_dir_record(out_dir),
    'n_questions': n_questions,
    'summary': summary,
    'paired': paired,
  }
  ledger.parent.mkdir(parents=True, exist_ok=True)
  with ledger.open('a', encoding='utf-8') as f:
    f.write(json.dumps(row) + '\n')


def pin(names: list[str], pins: Path = DATA_PINS) -> dict[str, dict[str, Any]]:
  """Load the data each protocol reads (no embedding) and write its fingerprint into ``pins`` (merged)."""
  from experiments.lib import common, fit_setup

  out = json.loads(Path(pins).read_text(encoding='utf-8')) if Path(pins).is_file() else {}
  for name in names:
    cfg = fixed_config(name, 'fit')
    key = data_key(cfg)
    if key in out:
      print(f'{name}: {key[:12]} already pinned')
      continue
    episodes, _ = common.load_dataset(cfg, cfg.dataset)
    fit_config = fit_setup.read(cfg).config
    if fit_config.split == 'parts':
      train, _ = common.load_dataset(cfg, fit_config.train)
      episodes = train + episodes  # the order experiments.fit reads them in
    out[key] = {
      'fingerprint': data_fingerprint(episodes),
      'n_episodes': len(episodes),
      'n_questions': sum(len(e.questions) for e in episodes),
      'first_protocol': name,
    }
    print(f'{name}: {key[:12]} -> {out[key]["fingerprint"][:12]} ({len(episodes)} episodes)')
    Path(pins).write_text(json.dumps(out, indent=1, sort_keys=True) + '\n', encoding='utf-8')
  return out


if __name__ == '__main__':
  import argparse

  p = argparse.ArgumentParser(description='pin the data fingerprints of protocols (conf/protocol/data.json)')
  p.add_argument('command', choices=['pin'])
  p.add_argument('names', nargs='*', help='protocol names (default: every protocol)')
  a = p.parse_args()
  pin(a.names or sorted(q.stem for q in PROTOCOL_DIR.glob('*.yaml')))
