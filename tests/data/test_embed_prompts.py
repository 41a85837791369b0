"""The seeds' embedders by one option: any sentence-transformers model with its query and document prompts (explicit,
or the model's own ``prompts`` config), prompts part of the cache key; a model that is not there is one line before
any work. Offline: a copy of the bundled MiniLM folder given a prompts config."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from engram_jax.core.types import Episode, Item, Question
from engram_jax.data import embed
from engram_jax.eval import evaluation
from experiments.lib import common

CONF = str(Path(__file__).resolve().parents[2] / 'conf')


def _prompted_copy(tmp_path: Path) -> Path:
  folder = tmp_path / 'minilm-prompts'
  shutil.copytree(embed.resolve_model_path(embed.DEFAULT_MODEL), folder)
  cfg = json.loads((folder / 'config_sentence_transformers.json').read_text())
  cfg['prompts'] = {'query': 'query: ', 'document': 'passage: '}
  (folder / 'config_sentence_transformers.json').write_text(json.dumps(cfg))
  return folder


def test_prompts_resolve_and_key_the_cache(tmp_path):
  folder = _prompted_copy(tmp_path)
  named = embed.sentence_transformer_encoder(
    'm', path=str(folder), query_prompt_name='query', document_prompt_name='document'
  )
  assert named.prompt('query') == 'query: ' and named.prompt('document') == 'passage: '
  q, d = named.for_role('query'), named.for_role('document')
  assert q.spec['prompt'] == 'query: ' and d.spec['prompt'] == 'passage: '
  assert len({embed.spec_hash(q.spec), embed.spec_hash(d.spec), embed.spec_hash(named.spec)}) == 3
  plain = embed.sentence_transformer_encoder('m', path=str(folder))
  assert plain.for_role('query') is plain  # no prompt: the unprompted encoder and cache
  e5 = embed.sentence_transformer_encoder('m', path=str(folder), query_prompt='query: ')
  assert embed.spec_hash(e5.for_role('query').spec) == embed.spec_hash(q.spec)  # the same text, the same key
  with pytest.raises(
    ValueError,
    match=r"query_prompt_name 'nope' is not among the model's prompts \['document', "
    r"'query'\]",
  ):
    embed.sentence_transformer_encoder('m', path=str(folder), query_prompt_name='nope').prompt('query')


@pytest.mark.slow
def test_prompted_questions_embed_apart_offline(tmp_path, monkeypatch):
  monkeypatch.setenv('HF_HUB_OFFLINE', '1')
  folder = _prompted_copy(tmp_path)
  with initialize_config_dir(config_dir=CONF, version_base='1.3'):
    cfg = compose(
      'config',
      overrides=[
        f'embedder.encoder.path={folder}',
        'embedder.model_id=minilm-prompts',
        '+embedder.encoder.query_prompt_name=query',
        '+embedder.encoder.document_prompt_name=document',
        f'paths.cache_dir={tmp_path}/cache',
        'eval.progress=false',
      ],
    )
  fn = common.make_embedder(cfg)
  ep = Episode(
    id='e',
    items=(Item('i0', 'the cat sat on the mat', 'p', 0), Item('i1', 'stocks fell', 'p', 1)),
    questions=(Question('q0', 'where did the cat sit?', ('i0',), ('p',), 'c'),),
  )
  ((docs, qs),) = evaluation.embed_episodes([ep], fn)
  model = embed.sentence_transformer_encoder('m', path=str(folder)).model
  want_q = model.encode(['query: where did the cat sit?'], normalize_embeddings=True)
  want_d = model.encode(['passage: the cat sat on the mat', 'passage: stocks fell'], normalize_embeddings=True)
  assert np.allclose(qs, want_q, atol=1e-5) and np.allclose(docs, want_d, atol=1e-5)
  bare = model.encode(['where did the cat sit?'], normalize_embeddings=True)
  assert not np.allclose(qs, bare, atol=1e-3)  # the prompt changed the vector
  ((docs2, qs2),) = evaluation.embed_episodes([ep], common.make_embedder(cfg))  # warm: from the cache
  assert np.array_equal(qs2, qs) and np.array_equal(docs2, docs)
  assert len(list((tmp_path / 'cache').glob('minilm-prompts-*'))) == 2  # queries and documents cached apart


def test_a_missing_model_is_one_line_before_any_work(tmp_path, monkeypatch):
  monkeypatch.setenv('HF_HUB_OFFLINE', '1')
  monkeypatch.setenv('HF_HOME', str(tmp_path / 'hf'))
  with initialize_config_dir(config_dir=CONF, version_base='1.3'):
    cfg = compose('config', overrides=['embedder=bge_small', f'paths.cache_dir={tmp_path}/cache'])
  assert cfg.embedder.encoder.query_prompt.startswith('Represent this sentence for searching relevant passages')
  with pytest.raises(
    ValueError,
    match=r"model 'BAAI/bge-small-en-v1.5' .* is neither a local folder nor in the "
    r'Hugging Face cache.*set embedder.encoder.path',
  ) as e:
    common.make_embedder(cfg)
  assert '\n' not in str(e.value)
