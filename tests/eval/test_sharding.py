"""Episode-axis splitting: padding, the split runner, and a 4-device evaluation equal to the 1-device one.

JAX fixes its device count at import, so the multi-device case runs in a fresh process with
``XLA_FLAGS=--xla_force_host_platform_device_count=4`` (4 CPU devices).
"""

import textwrap

import jax
import numpy as np
import pytest
from omegaconf import OmegaConf
from run_script import script_result

from engram_jax.eval import sharding
from experiments.lib import common

# Five episodes (odd, so every group is padded to 4 or 8), of mixed sizes (a few size groups, one of a single
# episode); deterministic pipelines and a random one (cos2 = perturbed cosine, which draws from the episode keys).
# Three more whose items repeat 6 vectors (exact cosine ties everywhere) under CFS-R, alone and fused: a shard_map
# program compiled the pool's dot products apart from the one-device program and broke those ties differently.
SCRIPT = textwrap.dedent("""
  import json, sys
  import jax, numpy as np
  sys.path.insert(0, 'tests/eval')
  from test_evaluation import _emb, _episode
  from engram_jax.eval import evaluation, pipeline, sharding
  from engram_jax.eval.legcache import LegCache

  assert jax.device_count() == 4, jax.devices()
  eps = [_episode(12, 3, 'a'), _episode(140, 30, 'b'), _episode(30, 5, 'c'), _episode(300, 9, 'd'),
         _episode(40, 4, 'e')]
  cos, bm = {'op': 'cosine'}, {'op': 'bm25'}
  pipes = {'cosine': pipeline.make_pipeline(legs={'cos': cos}),
           'rrf': pipeline.make_pipeline(fusion='rrf', legs={'cos': cos, 'bm25': bm}),
           'cos2': pipeline.make_pipeline(fusion='rrf', legs={'cos': cos, 'cos2': {'op': 'cos2', 'eps': 0.5}}),
           'mmr': pipeline.make_pipeline(fusion='rrf', legs={'cos': cos, 'mmr': {'op': 'mmr', 'k': 6, 'lam': 0.6}})}
  embs = [_emb(e, seed=i) for i, e in enumerate(eps)]

  def tied(ep, seed, d=64):
    rng = np.random.default_rng(seed)
    base = rng.normal(size=(6, d)).astype(np.float32)
    qs = rng.normal(size=(len(ep.questions), d)).astype(np.float32)
    norm = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)
    return norm(base)[rng.integers(0, 6, ep.n_items)], norm(qs)

  tie_eps = [_episode(300, 40, 'ta'), _episode(260, 33, 'tb'), _episode(280, 20, 'tc')]
  tie_pipes = {'cfsr': pipeline.make_pipeline(legs={'cfsr': {'op': 'cfsr'}}),
               'fused': pipeline.make_pipeline(fusion='rrf', legs={'cos': cos, 'cfsr': {'op': 'cfsr', 'depth': 50}})}
  tie_embs = [tied(e, i) for i, e in enumerate(tie_eps)]

  blocks = sharding.split_run(jax.jit(lambda a: jax.lax.map(lambda v: v * 2, a)), (np.arange(5.0),),
                              episode_args=(True,), devices=jax.devices(), gather=False)
  assert [p.shape for p in blocks.parts] == [(2,)] * 4 and blocks.gather().tolist() == [0, 2, 4, 6, 8]
  assert [next(iter(p.devices())) for p in blocks.parts] == jax.devices()
  out = {}
  for devices in (1, 4):
    for name, e, m, p, cache in (('plain', eps, embs, pipes, None), ('ties', tie_eps, tie_embs, tie_pipes, None),
                                 ('ties_cached', tie_eps, tie_embs, tie_pipes, LegCache())):
      r = evaluation.evaluate(e, m, p, k=5, metrics=['ndcg@5', 'recall@5'], seed=3, progress=False,
                              devices=devices, leg_cache=cache)
      out[f'{name}{devices}'] = {'ids': r.question_ids, 'retrieved': r.retrieved,
                                 'scores': {n: {m: v.tolist() for m, v in s.items()} for n, s in r.scores.items()}}
  print('RESULT ' + json.dumps(out))
""")


def test_pad_episodes_repeats_the_last_episode():
  tree = {'x': np.arange(10).reshape(5, 2), 'i': np.arange(5, dtype=np.int32)}
  padded = sharding.pad_episodes(tree, 4)
  assert padded['x'].shape == (8, 2) and padded['i'].tolist() == [0, 1, 2, 3, 4, 4, 4, 4]
  assert np.array_equal(padded['x'][:5], tree['x']) and (padded['x'][5:] == tree['x'][-1]).all()
  assert sharding.pad_episodes(tree, 5)['x'].shape == (5, 2)
  assert [sharding.padded_size(n, 4) for n in (1, 4, 5, 8)] == [4, 4, 8, 8]


def test_device_count_is_checked():
  assert sharding.n_devices(None) == jax.device_count()
  assert sharding.n_devices(1) == 1
  for bad in (0, -1, 1.5):
    with pytest.raises(ValueError, match='integer >= 1'):
      sharding.n_devices(bad)
  with pytest.raises(ValueError, match='device_count'):
    sharding.n_devices(jax.device_count() + 1)


def test_eval_devices_config():
  assert common.eval_devices(common.eval_settings(OmegaConf.create({'eval': {'devices': None}}))) is None
  assert common.eval_devices(common.eval_settings(OmegaConf.create({'eval': {}}))) is None
  assert common.eval_devices(common.eval_settings(OmegaConf.create({'eval': {'devices': 2}}))) == 2
  for bad in (0, 'all', True):
    with pytest.raises(ValueError, match=r'^eval.devices must be null \(all devices\) or an integer >= 1'):
      common.eval_settings(OmegaConf.create({'eval': {'devices': bad}}))


@pytest.mark.slow
def test_four_devices_give_the_one_device_results():
  out = script_result(SCRIPT, fake_devices=4)
  assert len(out['plain1']['ids']) == 3 + 30 + 5 + 9 + 4
  for case, one in (('plain', out['plain1']), ('ties', out['ties1']), ('ties_cached', out['ties1'])):
    four = out[f'{case}4']
    assert four['ids'] == one['ids']
    for name in one['retrieved']:
      assert four['retrieved'][name] == one['retrieved'][name], (case, name)  # question by question, cos2 included
      assert four['scores'][name] == one['scores'][name], (case, name)
  assert out['ties_cached1'] == out['ties1']


def test_split_run_on_one_device_is_the_call_itself():
  double = jax.jit(lambda a, b: jax.lax.map(lambda v: v * 2 + b, a))
  x = np.arange(5.0)
  out = sharding.split_run(double, (x, 1.0), episode_args=(True, False), devices=jax.devices()[:1])
  assert isinstance(out, jax.Array) and out.tolist() == [1.0, 3.0, 5.0, 7.0, 9.0]
  with pytest.raises(ValueError, match='disagree'):
    sharding.split_run(double, (x, np.arange(3.0)), episode_args=(True, True), devices=jax.devices()[:1])
