"""The base-model reader mode: a plain-text prompt (no chat template) and the tokenizer read from a GGUF file,
on a tiny randomly initialised stand-in (a 1-layer GPT-2 with a word-level tokenizer, built in the test)."""

import pytest

from engram_jax.answer import reader as R

MESSAGES = [{'role': 'system', 'content': 'Answer briefly.'}, {'role': 'user', 'content': 'Where does Ann live?'}]


def test_render_plain_is_bos_system_blank_line_user():
  assert R.render_plain(MESSAGES, '<bos>') == '<bos>Answer briefly.\n\nWhere does Ann live?'
  assert R.render_plain(MESSAGES[1:]) == 'Where does Ann live?'
  with pytest.raises(ValueError, match='system and user messages only'):
    R.render_plain([*MESSAGES, {'role': 'assistant', 'content': 'x'}])


@pytest.fixture(scope='module')
def tiny_base_model(tmp_path_factory):
  """A folder with a tiny GPT-2 (random weights) and a word-level tokenizer without a chat template."""
  torch = pytest.importorskip('torch')
  transformers = pytest.importorskip('transformers')
  from tokenizers import Tokenizer, models, pre_tokenizers

  words = ['<bos>', '<eos>', '<pad>', '<unk>'] + 'answer briefly . where does ann live ? paris rome'.split()
  tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token='<unk>'))
  tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  fast = transformers.PreTrainedTokenizerFast(
    tokenizer_object=tok, bos_token='<bos>', eos_token='<eos>', pad_token='<pad>', unk_token='<unk>'
  )
  torch.manual_seed(0)
  cfg = transformers.GPT2Config(vocab_size=len(words), n_positions=64, n_embd=16, n_layer=1, n_head=2)
  cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id = 0, 1, 2
  folder = tmp_path_factory.mktemp('tiny_base')
  transformers.GPT2LMHeadModel(cfg).save_pretrained(folder)
  fast.save_pretrained(folder)
  return folder


def test_a_base_model_without_chat_template_reads_plain_text(tiny_base_model):
  with pytest.raises(ValueError, match=r'has no chat template \(a base model\?\); reader.prompt=plain'):
    R.HFReader(tiny_base_model, fingerprint='t', prompt='chat')
  reader = R.HFReader(tiny_base_model, fingerprint='t', prompt='plain', batch_size=2)
  assert reader.render(MESSAGES) == '<bos>Answer briefly.\n\nWhere does Ann live?'
  replies = reader.generate([MESSAGES, MESSAGES[1:], MESSAGES], max_new_tokens=3)
  assert len(replies) == 3 and replies[0] == replies[2]  # greedy: the same prompt, the same reply in any batch
  assert reader.generate([MESSAGES], max_new_tokens=3) == replies[:1]
  spec = reader.spec(3)
  assert spec['prompt'] == 'plain' and spec['chat_template'] is False  # plain answers never share a chat cache key


def test_the_tokenizer_and_weights_come_from_the_gguf_file(tiny_base_model, monkeypatch):
  """transformers reads a GGUF file through ``gguf_file=``: both loaders get it (the SmolLM2 route dequantises its
  GGUF ahead; a base model's GGUF, e.g. Gemma 3 270M, is read as is)."""
  import transformers

  seen = []
  real_tok, real_model = transformers.AutoTokenizer.from_pretrained, transformers.AutoModelForCausalLM.from_pretrained

  def tok(model, **kw):
    seen.append(('tokenizer', kw.get('gguf_file')))
    return real_tok(model)

  def mod(model, **kw):
    seen.append(('model', kw.pop('gguf_file', None)))
    return real_model(model, **kw)

  monkeypatch.setattr(transformers.AutoTokenizer, 'from_pretrained', tok)
  monkeypatch.setattr(transformers.AutoModelForCausalLM, 'from_pretrained', mod)
  (tiny_base_model / 'm.gguf').write_bytes(b'stand-in')  # fingerprinted by its sha256
  reader, _ = R.load_reader('hf', model=str(tiny_base_model), gguf_file='m.gguf', prompt='plain')
  assert seen == [('tokenizer', 'm.gguf'), ('model', 'm.gguf')]
  assert reader.fingerprint == 'gguf-sha256:' + R.sha256_file(tiny_base_model / 'm.gguf')


def test_length_batches_sort_by_length_and_cover_every_prompt():
  assert R.length_batches([30, 5, 12, 5, 40], 2) == [[1, 3], [2, 0], [4]]
  assert R.length_batches([], 4) == []
  batches = R.length_batches([7, 3, 9, 1, 3, 8, 2], 3)
  assert sorted(i for b in batches for i in b) == list(range(7)) and [len(b) for b in batches] == [3, 3, 1]


def test_generate_batches_by_token_length_and_keeps_the_given_order(tiny_base_model):
  """Prompts of mixed lengths go to the model shortest first (a batch pads to its longest), and each reply comes
  back at its prompt's position: the same replies as one prompt at a time."""
  long = [MESSAGES[0], {'role': 'user', 'content': 'where does ann live ? where does ann live ? paris rome'}]
  short = [{'role': 'user', 'content': 'paris ?'}]
  prompts = [long, short, MESSAGES, short, long]
  reader = R.HFReader(tiny_base_model, fingerprint='t', prompt='plain', batch_size=2)
  widths = []
  real = reader.model.generate

  def spy(**kw):
    widths.append(tuple(kw['input_ids'].shape))
    return real(**kw)

  reader.model.generate = spy
  replies = reader.generate(prompts, max_new_tokens=3)
  assert [w[0] for w in widths] == [2, 2, 1] and [w[1] for w in widths] == sorted(w[1] for w in widths)
  assert widths[0][1] == len(reader.tokenizer(reader.render(short), add_special_tokens=False)['input_ids'])
  one = [reader.generate([p], max_new_tokens=3)[0] for p in prompts]
  assert replies == one and replies[1] == replies[3] and replies[0] == replies[4]
  assert reader.generated == 5 + 5
