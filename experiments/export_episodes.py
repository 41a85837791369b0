"""Export a dataset's episodes, as its loader reads them (the part, template and normalisations of its config), to an
episodes file (:mod:`engram_jax.data.episodes_jsonl`): a real example of the format, and a check of it against the
loaders we trust (the file read back scores byte-identically, ``docs/formats.md``).

  python -m experiments.export_episodes dataset=locomo out=locomo.episodes.jsonl

The file's first line carries the loader's report (so a run on the file records what the loader normalised) and the
dataset's config as ``source``; the command printed last runs ``experiments.evaluate`` on the file with the
dataset's own settings (name, metrics, categories, metrics module).
"""

from __future__ import annotations

import logging
import re
import shlex
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from engram_jax.core.errors import EngramError
from engram_jax.data import episodes_jsonl
from experiments.lib import checks, common

log = logging.getLogger(__name__)
_PLAIN = re.compile(r'^[A-Za-z0-9_.@/-]+$')


def override_value(value: Any) -> str:
  """``value`` in Hydra's override grammar (lists ``[a,b]``, dicts ``{k:v}``, strings quoted unless plain).

  Example:
    >>> override_value({1: 'multi-hop', 2: 'two words'})
    '{1:multi-hop,2:"two words"}'
  """
  if isinstance(value, dict):
    return '{' + ','.join(f'{k}:{override_value(v)}' for k, v in value.items()) + '}'
  if isinstance(value, (list, tuple)):
    return '[' + ','.join(override_value(v) for v in value) + ']'
  if value is None:
    return 'null'
  if isinstance(value, bool):
    return str(value).lower()
  if isinstance(value, (int, float)) or _PLAIN.match(str(value)):
    return str(value)
  return '"' + str(value).replace('\\', '\\\\').replace('"', '\\"') + '"'


def evaluate_command(out: str, dataset: dict[str, Any]) -> str:
  """The ``experiments.evaluate`` command that scores the episodes file ``out`` with ``dataset``'s settings (every
  key of its config but the loader)."""
  episodes_keys = set(OmegaConf.load(common.CONF / 'dataset' / 'episodes.yaml'))
  args = ['python', '-m', 'experiments.evaluate', 'dataset=episodes', f'dataset.loader.path={out}']
  for key, value in dataset.items():
    if key != 'loader' and value != {}:
      args.append(f'{"" if key in episodes_keys else "+"}dataset.{key}={override_value(value)}')
  return ' '.join(shlex.quote(a) for a in args)


def export(cfg: DictConfig) -> tuple[str, str]:
  """Write ``cfg.dataset``'s episodes to ``cfg.out``; returns ``(path written, evaluate command)``."""
  if not cfg.get('out'):
    raise EngramError('out=FILE is required: the episodes file to write (.jsonl, or .jsonl.gz)')
  checks.check_loader_selection(cfg.dataset.get('loader'), 'dataset')
  episodes, report = common.load_dataset(cfg, cfg.dataset)
  dataset = OmegaConf.to_container(cfg.dataset, resolve=True)
  path = episodes_jsonl.write_episodes_jsonl(
    str(cfg.out), episodes, name=dataset['name'], load_report=report, source={'dataset': dataset}
  )
  n_items = sum(e.n_items for e in episodes)
  n_questions = sum(len(e.questions) for e in episodes)
  log.info('wrote %s: %d episodes, %d items, %d questions', path, len(episodes), n_items, n_questions)
  return str(path), evaluate_command(str(cfg.out), dataset)


@hydra.main(version_base='1.3', config_path='../conf', config_name='export_episodes')
@common.plain_errors  # the project's errors (EngramError) as one line; ENGRAM_FULL_ERROR=1 for the traceback
def main(cfg: DictConfig) -> None:
  path, command = export(cfg)
  print(f'wrote {path}; score it as the bundled loader is scored:\n{command}')


if __name__ == '__main__':
  main()
