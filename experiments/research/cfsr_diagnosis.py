"""Why does standalone CFS-R trail cosine on one dataset and not on another? Per-question evidence from the data.

For every question of the run's dataset it measures, with the operator's own hard path (``cfsr_scores``) and an
independent exact solver (``scipy.optimize.nnls`` on the stacked ridge system), at the configured pool, lambda,
iterations and w:

* ``n_items``, ``pool`` (= min(P, N)): whether the pool is the whole episode;
* ``mean_offdiag_cos``: mean cosine between distinct pool items; ``cond``: the pool Gram's condition number;
* ``support``: pool items with a coefficient > 1e-6 (projected gradient, PG) and ``support_exact`` (exact NNLS);
* ``pg_rel_gap``: relative objective gap of the PG coefficients to the exact optimum (did 80 steps converge?);
* ``gold_in_support``: the share of gold items (in the pool) with a non-zero PG coefficient;
* the gold item's best rank under cosine, under CFS-R, and under CFS-R with the exact coefficients;
* NDCG@k (label) of cosine, CFS-R (PG), CFS-R (exact), and CFS-R at w = 0.5.

  python -m experiments.research.cfsr_diagnosis                                        # LoCoMo (all conversations)
  python -m experiments.research.cfsr_diagnosis dataset=longmemeval_s dataset.loader.part=train

Writes ``cfsr_diagnosis.json`` (per question and means) to the Hydra run folder and prints the means.
Diagnosis only: it selects nothing and is not a protocol.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import hydra
import jax
import jax.numpy as jnp
import numpy as np
import scipy.optimize
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from engram_jax.core import batch
from engram_jax.eval import evaluation
from engram_jax.metrics import labels as metrics
from engram_jax.ops import cfsr as cfsr_ops
from experiments.lib import common

log = logging.getLogger(__name__)


def exact_nnls_ridge(pool_emb: np.ndarray, query: np.ndarray, lam: float) -> np.ndarray:
  """``argmin_{a >= 0} ||z - C^T a||^2 + lam ||a||^2`` exactly (``[P]``), by NNLS on ``[C^T; sqrt(lam) I]``."""
  p = pool_emb.shape[0]
  a_mat = np.vstack([pool_emb.T.astype(np.float64), np.sqrt(lam) * np.eye(p)])
  rhs = np.concatenate([query.astype(np.float64), np.zeros(p)])
  return scipy.optimize.nnls(a_mat, rhs, maxiter=50 * p)[0]


def objective(pool_emb: np.ndarray, query: np.ndarray, a: np.ndarray, lam: float) -> float:
  r = query.astype(np.float64) - pool_emb.T.astype(np.float64) @ a
  return float(r @ r + lam * a @ a)


def blend(a: np.ndarray, b: np.ndarray, w: float) -> np.ndarray:
  """``w mm(a) + (1 - w) mm(b)`` (the operator's blend; mm = min-max over the pool, 0 when flat)."""

  def mm(x):
    span = x.max() - x.min()
    return (x - x.min()) / span if span > 0 else np.zeros_like(x)

  return w * mm(a) + (1 - w) * mm(b)


_NNLS_PG = jax.jit(
  lambda g, b, lam, iterations: cfsr_ops.nnls_ridge_pg(g, b, lam=lam, iterations=iterations), static_argnums=3
)


def ranked(scores: np.ndarray) -> np.ndarray:
  """Item indices best first (ties: the later item first, the shared rule); -inf items last."""
  n = len(scores)
  return np.lexsort((-np.arange(n), -np.where(np.isfinite(scores), scores, -np.inf)))


def best_gold_rank(scores: np.ndarray, gold: np.ndarray) -> int:
  """1-based rank of the best-ranked gold item under ``scores`` (``[N]``, -inf = unranked; ties: later first)."""
  ranks = np.empty(len(scores), int)
  ranks[ranked(scores)] = np.arange(1, len(scores) + 1)
  return int(ranks[gold].min()) if gold.any() else -1


def diagnose_episode(
  arr: batch.EpisodeArrays, n_q: int, *, pool: int, lam: float, w: float, iterations: int, k: int
) -> list[dict[str, Any]]:
  """Per-question diagnostics of one episode (its first ``n_q`` questions)."""
  where = np.asarray(arr.where)
  n = int(where.sum())
  docs = np.asarray(arr.docs)[:n]
  pg = np.asarray(
    jax.jit(
      lambda q: cfsr_ops.cfsr_scores(q, arr.docs, where=arr.where, pool=pool, lam=lam, w=w, iterations=iterations)
    )(arr.queries[:n_q])
  )
  out = []
  for j in range(n_q):
    q = np.asarray(arr.queries[j])
    gold = np.asarray(arr.labels[j])[:n]
    cos = docs @ q
    order = ranked(cos)[: min(pool, n)]  # the operator's pool: cosine top-P, later item first on ties
    c = docs[order]
    gram = c @ c.T
    ev = np.linalg.eigvalsh(gram.astype(np.float64))
    a_exact = exact_nnls_ridge(c, q, lam)
    s_pg = pg[j][:n]
    b = cos[order]
    a_pg = np.asarray(_NNLS_PG(jnp.asarray(gram), jnp.asarray(b), lam, iterations), np.float64)
    f_pg, f_ex = objective(c, q, a_pg, lam), objective(c, q, a_exact, lam)
    exact_scores = np.full(n, -np.inf)
    exact_scores[order] = blend(a_exact, b, w)
    half_scores = np.full(n, -np.inf)
    half_scores[order] = blend(a_pg, b, 0.5)
    gold_pool = gold[order]
    off = gram[~np.eye(len(order), dtype=bool)]
    row = {
      'n_items': n,
      'pool': len(order),
      'mean_offdiag_cos': float(off.mean()) if off.size else float('nan'),
      'cond': float(ev[-1] / max(ev[0], 1e-12)),
      'support': int(np.sum(a_pg > 1e-6)),
      'support_exact': int(np.sum(a_exact > 1e-6)),
      'pg_rel_gap': (f_pg - f_ex) / max(f_ex, 1e-12),
      'gold_in_pool': float(gold_pool.any()),
      'gold_in_support': float(np.mean(a_pg[gold_pool] > 1e-6)) if gold_pool.any() else float('nan'),
      'gold_rank_cosine': best_gold_rank(cos, gold),
      'gold_rank_cfsr': best_gold_rank(s_pg, gold),
      'gold_rank_cfsr_exact': best_gold_rank(exact_scores, gold),
    }
    for name, s in (('cosine', cos), ('cfsr', s_pg), ('cfsr_exact', exact_scores), ('cfsr_w0.5', half_scores)):
      top = ranked(s)[:k]
      row[f'ndcg@{k}_{name}'] = float(metrics.ndcg_at_k(top[None], gold[None], k=k)[0])
    out.append(row)
  return out


@hydra.main(version_base='1.3', config_path='../../conf', config_name='config')
def main(cfg: DictConfig) -> None:
  opts = {'pool': 150, 'lam': 0.005, 'w': 0.9, 'iterations': 80}
  opts.update({key: v for key, v in dict(cfg.get('diagnosis') or {}).items() if key in opts})
  episodes, _ = common.load_dataset(cfg, cfg.dataset)
  embeddings = evaluation.embed_episodes(
    episodes, common.make_embedder(cfg, progress=common.eval_settings(cfg).progress)
  )
  rows = []
  for ep, (d, q) in zip(episodes, embeddings):
    arr = batch.episode_arrays(ep, d, q)
    for r, question in zip(diagnose_episode(arr, len(ep.questions), k=int(cfg.eval.k), **opts), ep.questions):
      rows.append({'question_id': question.id, 'category': question.category, **r})
  keys = [key for key in rows[0] if key not in ('question_id', 'category')]
  means = {key: float(np.nanmean([r[key] for r in rows])) for key in keys}
  means['share_pool_is_episode'] = float(np.mean([r['pool'] == r['n_items'] for r in rows]))
  means['share_pg_gap_over_1pct'] = float(np.mean([r['pg_rel_gap'] > 0.01 for r in rows]))
  means['median_gold_rank_cosine'] = float(np.median([r['gold_rank_cosine'] for r in rows]))
  means['median_gold_rank_cfsr'] = float(np.median([r['gold_rank_cfsr'] for r in rows]))
  out = {'dataset': cfg.dataset.name, 'n_questions': len(rows), 'options': opts, 'means': means, 'per_question': rows}
  path = Path(HydraConfig.get().runtime.output_dir) / 'cfsr_diagnosis.json'
  path.write_text(json.dumps(out, indent=1))
  print(f'{cfg.dataset.name}: {len(rows)} questions, CFS-R {opts}')
  for key, v in means.items():
    print(f'  {key:28s} {v:.4f}')
  log.info('wrote %s', path)


if __name__ == '__main__':
  main()
