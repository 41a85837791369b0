"""Write a run's items and questions as a vectors file, embedded by the run's embedder (docs/vectors.md), or, with
``texts=true``, the texts to embed elsewhere as JSONL (nothing is embedded).

  python -m experiments.export_vectors dataset=locomo out=outputs/vectors/locomo-minilm.npz
  python -m experiments.export_vectors experiment=cfsr_table texts=true out=outputs/vectors/locomo-texts.jsonl

The episodes written are the run's (conf/config.yaml composed as ``experiments.evaluate`` composes it): its
datasets (``dataset=``, or an experiment's ``datasets``) and the training sets its pipelines are tuned on
(``tune.train``), so ``embedder=vectors`` with the file runs that experiment. Kept short: the layout and the writers
are :mod:`engram_jax.data.vectors`'.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig

from engram_jax.core.errors import EngramError
from engram_jax.core.types import Episode
from engram_jax.data import vectors
from engram_jax.eval import evaluation
from experiments.lib import checks, common

log = logging.getLogger(__name__)


def run_episodes(cfg: DictConfig) -> tuple[list[Episode], dict[str, int]]:
  """The episodes a run of ``cfg`` embeds (its datasets, then the training sets its pipelines are tuned on), and
  how many each set gave."""
  episodes, counts = [], {}
  for name, ds in checks.datasets_of(cfg).items():
    eps, _ = common.load_dataset(cfg, ds)
    episodes += eps
    counts[name] = len(eps)
  for pipe, node in cfg.pipeline.items():
    for tname in (node.get('tune') or {}).get('train') or []:
      if f'train_sets.{tname}' not in counts:
        why = f'pipeline {pipe} is tuned on training set {tname}'
        eps, _ = common.load_dataset(cfg, cfg.train_sets[tname], purpose=why)
        episodes += eps
        counts[f'train_sets.{tname}'] = len(eps)
  return episodes, counts


def run(cfg: DictConfig) -> dict[str, Any]:
  """Write ``cfg.out``; returns what was written (path, rows, sha256 and dimension of a vectors file)."""
  want = '.jsonl' if cfg.texts else '.npz'
  if not cfg.get('out'):
    raise EngramError(f'export_vectors needs the file to write: out=FILE{want}')
  if Path(str(cfg.out)).suffix != want:
    raise EngramError(f'out={cfg.out}: {"texts=true writes" if cfg.texts else "a vectors file is"} a {want} file')
  progress = common.eval_settings(cfg).progress
  embed_fn = None if cfg.texts else common.make_embedder(cfg, progress=progress)  # a missing model: one line, first
  episodes, counts = run_episodes(cfg)
  if cfg.texts:
    info = vectors.write_texts(str(cfg.out), episodes)
  else:
    embeddings = evaluation.embed_episodes(episodes, embed_fn)
    info = vectors.write_vectors(str(cfg.out), episodes, embeddings, model_id=str(cfg.embedder.model_id))
  info['episodes'] = counts
  print(json.dumps(info, indent=1))
  return info


@hydra.main(version_base='1.3', config_path='../conf', config_name='export_vectors')
@common.plain_errors  # the project's errors (EngramError) as one line; ENGRAM_FULL_ERROR=1 for the traceback
def main(cfg: DictConfig) -> None:
  run(cfg)


if __name__ == '__main__':
  main()
