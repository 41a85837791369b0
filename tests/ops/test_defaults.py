"""The defaults the published tables rely on are pinned: in the operator registry, in the library functions and in
every pipeline YAML.

Where the values come from:

* CFS sigma 0.40, beta 0.20: /work/shared/seeds/000_bbc7b71999316dde.txt, the CFS post ("I use σ = 0.40 in
  unit-norm embedding space", "I use β = 0.20", line 195 and 197).
* CFS-R P 150, lambda 0.005, 80 iterations, w 0.90: the same file, the CFS-R post ("The current locked setup uses
  w = 0.90, λ = 0.005, P = 150, and 80 iterations", line 52); its deployable form "RRF(cosine top-10, BM25 top-10,
  CFS-R top-50), CFS-R weighted 3x → final top-10" (line 81; the table row "CFS-R top50 w3", line 95).
* RRF k0 60: the same file, the CFS post ("score(c) = Σ over r ∈ {cos, BM25, CFS} of 1 / (60 + rank_r(c))",
  line 229).
* BM25 k1 1.5, b 0.75, epsilon 0.25: no seed post states BM25's parameters (the posts only name "BM25"). They are
  rank_bm25's ``BM25Okapi`` defaults, which README.md ("BM25 is rank-bm25's BM25Okapi (k1 1.5, b 0.75,
  epsilon 0.25) exactly") and engram_jax.ops.bm25 say we reproduce; pinned here to those values and to rank_bm25.

A knob's default is declared once, in its operator's registry declaration (``engram_jax.ops.get(op).defaults``);
the leg and math functions repeat it as their keyword defaults, and both are pinned. Each YAML leg is checked on its
effective parameters (``LegSpec.options``): the values the YAML sets, else the registry defaults (a leg that sets
nothing inherits them), so changing a default or a YAML value breaks a test.
"""

import inspect
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from rank_bm25 import BM25Okapi

from engram_jax import ops
from engram_jax.eval import pipeline
from engram_jax.ops import bm25, cfs, cfsr, rrf, tcfsr, tide

CONF = Path(__file__).resolve().parents[2] / 'conf' / 'pipeline'
YAMLS = sorted(CONF.glob('*.yaml'))

BM25 = {'k1': 1.5, 'b': 0.75, 'epsilon': 0.25}  # rank_bm25 BM25Okapi (README.md); no seed post states them
CFS = {'sigma': 0.40, 'beta': 0.20}  # seeds/000_bbc7b71999316dde.txt, the CFS post, lines 195, 197
CFSR = {'pool': 150, 'lam': 0.005, 'iterations': 80, 'w': 0.90}  # seeds/000_..., the CFS-R post, line 52
RRF_K0 = 60.0  # seeds/000_bbc7b71999316dde.txt, the CFS post, line 229: 1 / (60 + rank)
CFSR_DEPLOYED = {'depth': 50, 'weight': 3.0}  # seeds/000_..., the CFS-R post, line 81: CFS-R top-50, weighted 3x

# Operators whose score uses BM25 with these knobs (tide only with base='bm25'; mem0 calls bm25_leg with its
# defaults and has no BM25 knobs itself).
BM25_OPS = ('bm25', 'tide')
CFS_OPS = ('cfs',)
CFSR_OPS = ('cfsr', 'tcfsr_prior', 'tcfsr_basis', 'tcfsr_gated')
BM25_FUNCS = [bm25.bm25_leg, bm25.bm25_scores, tide.tide_leg]
CFS_FUNCS = [cfs.cfs_leg, cfs.cfs_select, cfs.soft_cfs_select, cfs.soft_cfs_select_gram]
CFSR_FUNCS = [
  cfsr.cfsr_leg,
  cfsr.cfsr_scores,
  tcfsr.tcfsr_prior_leg,
  tcfsr.tcfsr_basis_leg,
  tcfsr.tcfsr_gated_leg,
  tcfsr.tcfsr_prior_scores,
  tcfsr.tcfsr_basis_scores,
  tcfsr.tcfsr_gated_scores,
]


def _default(fn, name):
  return inspect.signature(fn).parameters[name].default


def _id(fn):
  return f'{fn.__module__}.{fn.__qualname__}'


def _cases(op_names, values):
  return [(op, name) for op in op_names for name in sorted(values)]


@pytest.mark.parametrize('op,name', _cases(BM25_OPS, BM25), ids=lambda x: x)
def test_registry_bm25_defaults(op, name):
  assert ops.get(op).defaults[name] == BM25[name]


@pytest.mark.parametrize('op,name', _cases(CFS_OPS, CFS), ids=lambda x: x)
def test_registry_cfs_defaults(op, name):
  assert ops.get(op).defaults[name] == CFS[name]


@pytest.mark.parametrize('op,name', _cases(CFSR_OPS, CFSR), ids=lambda x: x)
def test_registry_cfsr_defaults(op, name):
  assert ops.get(op).defaults[name] == CFSR[name]


@pytest.mark.parametrize('fn', BM25_FUNCS, ids=_id)
@pytest.mark.parametrize('name', sorted(BM25))
def test_bm25_defaults(fn, name):
  assert _default(fn, name) == BM25[name]


@pytest.mark.parametrize('name', sorted(BM25))
def test_bm25_defaults_are_rank_bm25s(name):
  assert _default(BM25Okapi.__init__, name) == BM25[name] == _default(bm25.bm25_scores, name)


@pytest.mark.parametrize('fn', CFS_FUNCS, ids=_id)
@pytest.mark.parametrize('name', sorted(CFS))
def test_cfs_defaults(fn, name):
  assert _default(fn, name) == CFS[name]


@pytest.mark.parametrize('fn', CFSR_FUNCS, ids=_id)
@pytest.mark.parametrize('name', sorted(CFSR))
def test_cfsr_defaults(fn, name):
  assert _default(fn, name) == CFSR[name]


@pytest.mark.parametrize('name', ['lam', 'w', 'iterations'])
def test_cfsr_pool_scores_defaults(name):
  """The pool-level twin (used when fitting lambda and w) starts from the same values (it takes no pool size)."""
  assert _default(cfsr.cfsr_pool_scores, name) == CFSR[name]


@pytest.mark.parametrize('fn', [pipeline.Pipeline, pipeline.make_pipeline, rrf.rrf_fuse, rrf.soft_rrf_fuse], ids=_id)
def test_rrf_k0_default(fn):
  assert _default(fn, 'k0') == RRF_K0


def _build(path):
  """The Pipeline a YAML file defines (its fixed form: tune / replicate / skip_datasets dropped), and its node."""
  name = path.stem
  node = OmegaConf.to_container(OmegaConf.load(path)[name])
  spec = {k: v for k, v in node.items() if k not in ('tune', 'replicate', 'skip_datasets')}
  return pipeline.make_pipeline(name=name, **spec), node


def _varied(node):
  """The knob paths a YAML varies per run (tune grid, replicate values)."""
  return {node[key]['param'] for key in ('tune', 'replicate') if node.get(key)}


def _legs_using(op_names):
  out = []
  for path in YAMLS:
    built, _ = _build(path)
    for leg in built.legs:
      if leg.op in op_names and (leg.op != 'tide' or leg.option('base') == 'bm25'):
        out.append((path.stem, leg.name))
  return out


# The seeds' BM25 legs (the 'words' analyzer; 'flat' is LongMemEval's official flat-bm25); the legs on the default lexical leg (protocol lexical_default) are
# checked against the protocol's ledger row below.
ALL_BM25_LEGS = _legs_using(BM25_OPS + ('mem0',))
BM25_LEGS = [
  (s, l)
  for s, l in ALL_BM25_LEGS
  if dict(_build(CONF / f'{s}.yaml')[0].leg(l).options).get('tokenizer', 'words') in ('words', 'flat')
]
EN_LEGS = [pair for pair in ALL_BM25_LEGS if pair not in BM25_LEGS]
CFS_LEG_IDS = _legs_using(CFS_OPS)
CFSR_LEG_IDS = _legs_using(CFSR_OPS)
RRF_YAMLS = [p.stem for p in YAMLS if _build(p)[0].fusion == 'rrf']


def test_the_yaml_lists_are_not_empty():
  """Guards the parametrised YAML checks below against silently checking nothing."""
  assert {'bm25', 'rrf_cos_bm25', 'bm25_recency', 'mem0'} <= {p for p, _ in BM25_LEGS}
  assert {'rrf_cos_bm25_cfs', 'rrf_cos_bm25_cfs_long'} <= {p for p, _ in CFS_LEG_IDS}
  assert {'cfsr', 'rrf_cos_bm25_cfsr', 'tcfsr_prior', 'rrf_cos_bm25_tcfsr_gated'} <= {p for p, _ in CFSR_LEG_IDS}
  assert {'rrf_cos_bm25', 'rrf_cos_bm25_cfs', 'rrf_cos_bm25_cfsr'} <= set(RRF_YAMLS)


def _leg(stem, leg_name):
  built, node = _build(CONF / f'{stem}.yaml')
  leg = built.leg(leg_name)
  return built, node, leg, dict(leg.options)


@pytest.mark.parametrize('stem,leg_name', BM25_LEGS, ids=[f'{p}-{l}' for p, l in BM25_LEGS])
def test_yaml_bm25_legs(stem, leg_name):
  _, node, leg, kw = _leg(stem, leg_name)
  if leg.op == 'mem0':  # mem0 has no BM25 knobs: its leg calls bm25_leg with bm25_leg's defaults
    assert not set(BM25) & set(kw)
    kw = {name: _default(bm25.bm25_leg, name) for name in BM25}
  for name, value in BM25.items():
    assert kw[name] == value, (stem, leg_name, name)
    assert f'legs.{leg_name}.{name}' not in _varied(node)


def test_every_other_bm25_leg_is_the_adopted_lexical_default():
  """A BM25 leg off the seeds' analyzer carries exactly the winner of the scored protocol lexical_default (its
  ledger row), under a pipeline whose name says so (``bm25en``); ``bm25_lucene`` is Anserini's defaults."""
  import json

  (row,) = [json.loads(l) for l in (CONF.parents[0] / 'lexical' / 'scored.jsonl').read_text().splitlines()]
  assert row['protocol'] == 'lexical_default' and row['adopted'] == 'winner' and not row['forced']
  assert {'bm25en', 'rrf_cos_bm25en', 'rrf_cos_bm25en_cfsr', 'bm25en_recency'} <= {s for s, _ in EN_LEGS}
  for stem, leg_name in EN_LEGS:
    _, node, _, kw = _leg(stem, leg_name)
    if stem == 'bm25_lucene':  # Lucene's BM25 as Anserini runs it: its own settings, not the protocol's
      assert {n: kw[n] for n in ('tokenizer', 'form', 'k1', 'b')} == {
        'tokenizer': 'english',
        'form': 'lucene',
        'k1': 0.9,
        'b': 0.4,
      }
      continue
    assert 'bm25en' in stem, stem
    for name, value in row['winner'].items():
      assert kw[name] == value, (stem, leg_name, name)
    assert f'legs.{leg_name}.k1' not in _varied(node)


@pytest.mark.parametrize('stem,leg_name', CFS_LEG_IDS, ids=[f'{p}-{l}' for p, l in CFS_LEG_IDS])
def test_yaml_cfs_legs(stem, leg_name):
  _, node, _, kw = _leg(stem, leg_name)
  for name, value in CFS.items():
    assert kw[name] == value, (stem, leg_name, name)
    assert f'legs.{leg_name}.{name}' not in _varied(node)


@pytest.mark.parametrize('stem,leg_name', CFSR_LEG_IDS, ids=[f'{p}-{l}' for p, l in CFSR_LEG_IDS])
def test_yaml_cfsr_legs(stem, leg_name):
  built, node, leg, kw = _leg(stem, leg_name)
  for name, value in CFSR.items():
    assert kw[name] == value, (stem, leg_name, name)
    assert f'legs.{leg_name}.{name}' not in _varied(node)
  if built.fusion == 'rrf':  # the deployable form: RRF(cosine top-10, BM25 top-10, CFS-R top-50 weighted 3)
    assert (leg.depth, leg.weight) == (CFSR_DEPLOYED['depth'], CFSR_DEPLOYED['weight'])
    assert [(l.depth, l.weight) for l in built.legs if l.name != leg_name] == [(10, 1.0), (10, 1.0)]


@pytest.mark.parametrize('stem', RRF_YAMLS)
def test_yaml_rrf_k0(stem):
  built, node = _build(CONF / f'{stem}.yaml')
  assert node.get('k0', RRF_K0) == RRF_K0  # absent (the default) or 60
  assert built.k0 == RRF_K0
  assert 'k0' not in _varied(node)
