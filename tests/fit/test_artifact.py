"""The fitted artifact: experiments.fit writes every learned part of every fold (and the final fit), evaluate
fitted=DIR applies it (each fold's fit to that fold's episodes: its out-of-fold scores, exactly; the final fit to
any other episode), and from Python the loaded artifact scores an episode as the CLI does."""

import dataclasses
import json

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from test_fit import CONF, HAVE

from engram_jax import retrieve
from engram_jax.fit import artifact
from engram_jax.fit.retrieve import encoder_of
from engram_jax.metrics.labels import ndcg_at_k

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not HAVE, reason='LoCoMo not found under the data root')]

COMPONENT = {  # the adapter's fit is the session's (tests/fit/shared_fits.py)
  'conditioned': 'fit.conditioned={knobs: [legs.cos.weight, k0], features: [cues, pool], hidden: 0, rank: 2, '
  'net_lr_scale: 0.5}',
}


def _compose(name, overrides, tmp_path):
  with initialize_config_dir(config_dir=CONF, version_base='1.3'):
    return compose(
      config_name=name,
      overrides=[
        'embedder=hashing',
        'pipeline=[rrf_cos_bm25]',
        'eval.n_resamples=100',
        'eval.progress=false',
        f'paths.cache_dir={tmp_path}/cache',
        *overrides,
      ],
    )


@pytest.mark.parametrize('variant', ['adapter', 'conditioned'])
def test_evaluate_fitted_dir_reproduces_the_out_of_fold_scores(tmp_path, variant, shared_run):
  from experiments import evaluate
  from experiments import fit as fit_exp

  two = 'dataset.loader.conversations=[conv-30,conv-26]'
  if variant == 'adapter':  # the session's adapter fit (tests/fit/test_adapter.py reads it too)
    from shared_fits import adapter_fit

    run_dir, res = adapter_fit(shared_run)
  else:
    cfg = _compose(
      'fit',
      [two, 'fit.folds=2', 'fit.steps=3', 'fit.batch_size=16', 'fit.baselines=[cosine]', 'fit.gap_checks=0',
       'fit.final=true', COMPONENT[variant]],
      tmp_path,
    )  # fmt: skip
    res = fit_exp.run(cfg, tmp_path / 'fit')
    run_dir = tmp_path / 'fit'
  assert json.loads((run_dir / 'artifact' / 'variants.json').read_text()) == ['fitted', variant]
  art = artifact.load(run_dir)  # the run's declared fit: the component's variant
  assert [c.name for c in art.components] == [variant] and sorted(art.fits) == ['final', 'fold_00', 'fold_01']
  entry = art.manifest['fits'][0]
  assert entry['n_train_questions'] == len(entry['train_question_ids']) > 0
  assert entry['train_fingerprint'] == artifact.fingerprint(entry['train_question_ids'])
  assert art.manifest['packages']['jax'] and 'commit' in art.manifest['git']
  assert any(k.startswith(f'{variant}/') for k in entry['tensors'])
  oof = dict(zip(res['per_question']['question_ids'], res['variants'][variant]['per_question']['ndcg@10']))
  # the CLI: the fit's own episodes get their folds' fits, a third conversation the final fit
  ev = evaluate.run(
    _compose('config', ['dataset.loader.conversations=[conv-30,conv-26,conv-41]', f'fitted={run_dir}'], tmp_path),
    tmp_path / 'eval',
  )
  used = ev['fitted_artifact']['episodes_by_fit']
  assert used['final'] == ['conv-41'] and sorted(used) == ['final', 'fold_00', 'fold_01']
  got = {r['id']: r['scores']['rrf_cos_bm25']['ndcg@10'] for r in ev['per_question']}
  assert all(got[q] == v for q, v in oof.items()) and len(got) > len(oof)
  # the scalar variant of the same run: its out-of-fold scores
  ev = evaluate.run(
    _compose('config', [two, f'fitted={run_dir}', '+fitted_variant=fitted'], tmp_path), tmp_path / 'eval_scalar'
  )
  got = [r['scores']['rrf_cos_bm25']['ndcg@10'] for r in ev['per_question']]
  assert dict(zip([r['id'] for r in ev['per_question']], got)) == dict(
    zip(res['per_question']['question_ids'], res['per_question']['fitted']['ndcg@10'])
  )
  # from Python: one episode scored with the final fit equals the CLI's scores for it
  from experiments.lib import common

  conv = _compose('config', ['dataset.loader.conversations=[conv-41]'], tmp_path)
  episodes, _ = common.load_dataset(conv, conv.dataset)
  from engram_jax.eval import evaluation

  embeddings = evaluation.embed_episodes(episodes, common.make_embedder(conv))
  node = OmegaConf.to_container(conv.embedder, resolve=True)
  art = artifact.load(run_dir)
  py = art.scorer('final')(episodes, embeddings, k=10, metrics=['ndcg@10'], seed=int(conv.seed), embedder=node)
  ev3 = evaluate.run(
    _compose('config', ['dataset.loader.conversations=[conv-41]', f'fitted={run_dir}'], tmp_path), tmp_path / 'e3'
  )
  cli = [r['scores']['rrf_cos_bm25']['ndcg@10'] for r in ev3['per_question']]
  np.testing.assert_array_equal(py['ndcg@10'], cli)
  # retrieve (label-free questions, the fit's own encoder vouching for the vectors) ranks as evaluate fitted= does:
  # the same top-k ids, so the same per-question scores (issue 50: one road)
  (ep,), ((docs, queries),) = episodes, embeddings
  free = [dataclasses.replace(q, gold=(), gold_parents=()) for q in ep.questions]
  top = retrieve(art, ep.items, free, k=10, item_vectors=docs, question_vectors=queries, embedder=encoder_of(node),
                 seed=int(conv.seed))  # fmt: skip
  assert [r.ids for r in top] == [r['retrieved']['rrf_cos_bm25'] for r in ev3['per_question']]
  index = ep.index_of()
  labels = np.zeros((len(ep.questions), ep.n_items), bool)
  for j, q in enumerate(ep.questions):
    labels[j, [index[g] for g in q.gold]] = True
  ranked = np.asarray([[index[i] for i in r.ids] for r in top])
  np.testing.assert_array_equal(np.asarray(ndcg_at_k(ranked, labels, k=10), np.float64), cli)
