"""Show (a) of issue 43, cheap: the out-of-tree component of docs/extending.md (``mypkg/lenweights.py``,
question-length-conditioned leg weights), written to a temporary folder (no project file edited), named in
``fit.component_modules``, fitted with the query adapter in one variant declared on the command line, saved, and
re-applied by ``experiments.evaluate fitted=RUN`` with every per-question score equal to the fit's out-of-fold one.
(The same with MiniLM, CFS-R and the conditioned knobs as a third component: ``docs/fitting.md``.)"""

import re
import sys
from pathlib import Path

import pytest
from test_artifact import _compose
from test_fit import HAVE

from engram_jax.fit import components as registry

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not HAVE, reason='LoCoMo not found under the data root')]

ROOT = Path(__file__).resolve().parents[2]


def _docs_module() -> str:
  """The ``mypkg/lenweights.py`` block of docs/extending.md, as written there."""
  text = (ROOT / 'docs' / 'extending.md').read_text()
  return re.search(r'```python\n(# mypkg/lenweights\.py\n.*?)```', text, re.S).group(1)


def test_an_out_of_tree_component_is_fitted_saved_and_reapplied(tmp_path, monkeypatch):
  from experiments import evaluate
  from experiments import fit as fit_exp

  pkg = tmp_path / 'oot' / 'mypkg_oot43'
  pkg.mkdir(parents=True)
  (pkg / 'lenweights.py').write_text(_docs_module())
  monkeypatch.syspath_prepend(str(tmp_path / 'oot'))
  before = dict(registry.COMPONENTS)
  try:
    two = 'dataset.loader.conversations=[conv-30,conv-26]'
    cfg = _compose(
      'fit',
      [two, 'fit.folds=2', 'fit.steps=3', 'fit.batch_size=16', 'fit.baselines=[cosine]', 'fit.gap_checks=0',
       'fit.params=[legs.cos.weight,legs.bm25.weight,k0]', 'fit.component_modules=[mypkg_oot43.lenweights]',
       'fit.adapter={rank: 2, lr_scale: 0.1, cfsr_grad: implicit, soft_query_legs: true}',
       '+fit.lenweights={knobs: [legs.cos.weight, legs.bm25.weight]}', '~fit.variants.adapter', '+fit.variants.mix=[adapter,lenweights]',
       'fit.check_components=false'],  # the contract: tests/fit/test_component_contract.py (cheaper there)
      tmp_path,
    )  # fmt: skip
    res = fit_exp.run(cfg, tmp_path / 'fit')
    assert res['variants']['mix']['spec'] == {
      'adapter': {'rank': 2, 'lr_scale': 0.1, 'cfsr_grad': 'implicit', 'soft_query_legs': True},
      'lenweights': {'knobs': ['legs.cos.weight', 'legs.bm25.weight']},
    }
    assert list(res['summary'])[-1] == 'rrf_cos_bm25 (mix, out of fold)' and 'adapter' not in res  # mix only
    oof = dict(zip(res['per_question']['question_ids'], res['variants']['mix']['per_question']['ndcg@10']))
    # a fresh registry: evaluate imports the module because the artifact's manifest names it
    registry.COMPONENTS.pop('lenweights')
    sys.modules.pop('mypkg_oot43.lenweights')
    ev = evaluate.run(
      _compose('config', [two, f'fitted={tmp_path / "fit"}', '+fitted_variant=mix'], tmp_path), tmp_path / 'eval'
    )
    assert ev['fitted_artifact']['components'] == ['adapter', 'lenweights']
    got = {r['id']: r['scores']['rrf_cos_bm25']['ndcg@10'] for r in ev['per_question']}
    assert got == oof and len(got) == 105 + 197
  finally:
    registry.COMPONENTS.clear()
    registry.COMPONENTS.update(before)
    sys.modules.pop('mypkg_oot43.lenweights', None)
