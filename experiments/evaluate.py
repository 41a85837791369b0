"""Evaluate retrieval pipelines on a dataset and write results.json + results.md to the Hydra run folder.

Kept short on purpose: the logic lives in the library (engram_jax.evaluation / report).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from engram_jax import embed, evaluation, pipeline, report

log = logging.getLogger(__name__)


def build_pipelines(cfg: DictConfig) -> dict[str, pipeline.Pipeline]:
  """Instantiate every selected pipeline config into a library Pipeline."""
  return {name: pipeline.make_pipeline(name=name, **instantiate(node)) for name, node in cfg.pipeline.items()}


def run(cfg: DictConfig, out_dir: Path) -> dict[str, Any]:
  episodes, load_report = instantiate(cfg.dataset.loader, root=cfg.paths.data_root)
  log.info('%s', load_report.summary())
  pipes = build_pipelines(cfg)
  e = cfg.embedder
  encoder = instantiate(e.encoder)  # lazy: a warm cache never loads the model

  def embed_fn(texts):
    return embed.embed_texts(texts, cache_dir=cfg.paths.cache_dir, model_id=e.model_id, encoder=encoder,
                             progress=cfg.eval.progress)

  embeddings = evaluation.embed_episodes(episodes, embed_fn)
  result = evaluation.evaluate(episodes, embeddings, pipes, k=cfg.eval.k, metrics=list(cfg.eval.metrics),
                               seed=cfg.seed, progress=cfg.eval.progress)
  categories = OmegaConf.to_container(cfg.dataset.categories) if cfg.dataset.get('categories') else {}
  summary = report.summarize(result, category_names=categories, seed=cfg.seed, n_resamples=cfg.eval.n_resamples,
                             baselines=list(cfg.eval.baselines))
  reference = OmegaConf.to_container(cfg.reference) if cfg.get('reference') else None
  table = report.markdown_table(
      summary, metrics=list(cfg.eval.metrics), reference=reference,
      reference_label=cfg.get('reference_label', 'published'),
      title=f'{cfg.dataset.name}: {len(result.question_ids)} questions, k={cfg.eval.k}, '
            f'embedder {e.model_id}')
  results = {'dataset': cfg.dataset.name, 'n_questions': len(result.question_ids), 'k': cfg.eval.k,
             'seed': cfg.seed, 'load_report': load_report.to_dict(), 'pipelines': summary,
             'reference': reference, 'per_question': report.per_question(result)}
  out_dir.mkdir(parents=True, exist_ok=True)
  (out_dir / 'results.json').write_text(json.dumps(results, indent=1))
  (out_dir / 'results.md').write_text(table)
  (out_dir / 'config_resolved.yaml').write_text(OmegaConf.to_yaml(cfg, resolve=True))
  print(table)
  log.info('wrote %s', out_dir / 'results.json')
  return results


@hydra.main(version_base='1.3', config_path='../conf', config_name='config')
def main(cfg: DictConfig) -> float:
  results = run(cfg, Path(HydraConfig.get().runtime.output_dir))
  first = next(iter(results['pipelines'].values()))
  return float(first[cfg.eval.metrics[0]])


if __name__ == '__main__':
  main()  # pylint: disable=no-value-for-parameter
