"""Packaged readers (a GGUF file inside installed packages): ``reader=gemma3_270m`` composes and finds its four part
packages (skipped where they are not installed), the parts of a stand-in package are concatenated and checked
against the file's sha256, and the spec of a chat reader is what it was (its cached answers stay valid)."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from engram_jax.answer import reader as R
from engram_jax.core.errors import EngramError

ROOT = Path(__file__).resolve().parents[2]


def _compose(overrides):
  with initialize_config_dir(config_dir=str(ROOT / 'conf'), version_base='1.3'):
    return compose(config_name='config', overrides=overrides)


@pytest.mark.parametrize('name', sorted(R.PACKAGED))
def test_each_packaged_reader_is_one_option(name):
  cfg = _compose(['dataset=fc_sh_6k', f'reader={name}'])
  assert cfg.reader.name == name and cfg.reader.get('prompt', 'chat') == R.PACKAGED[name].prompt
  assert cfg.reader.model is None and cfg.reader.questions is None


def test_gemma3_270m_resolves_its_gguf_from_the_four_part_packages():
  try:
    parts = R.packaged_parts('gemma3_270m')
  except FileNotFoundError as e:
    pytest.skip(str(e))
  assert [p.name for p in parts] == [f'gemma-3-270m-q4_k_m.gguf.part{i:02d}' for i in range(4)]
  assert R.packaged_sha256('gemma3_270m') == R.PACKAGED['gemma3_270m'].sha256


def _stand_in(tmp_path, monkeypatch, chunks, sha256):
  """Two packages ``fakepart1``/``fakepart2`` holding ``chunks``; a packaged reader ``fake`` made of them."""
  import hashlib

  for i, chunk in enumerate(chunks):
    pkg = tmp_path / f'fakepart{i + 1}'
    (pkg / 'data').mkdir(parents=True)
    (pkg / '__init__.py').write_text('')
    (pkg / 'data' / f'm.gguf.part{i:02d}').write_bytes(chunk)
  monkeypatch.syspath_prepend(str(tmp_path))
  parts = tuple((f'fakepart{i + 1}', f'data/m.gguf.part{i:02d}') for i in range(len(chunks)))
  fake = R.PackagedGGUF('fake', 'm.gguf', parts, 'pip install fake', sha256=sha256, prompt='plain')
  monkeypatch.setitem(R.PACKAGED, 'fake', fake)
  return hashlib.sha256(b''.join(chunks)).hexdigest()


def test_parts_are_found_in_order_and_hashed_as_one_file(tmp_path, monkeypatch):
  digest = _stand_in(tmp_path, monkeypatch, [b'GGUF-head', b'-tail'], sha256=None)
  assert [p.name for p in R.packaged_parts('fake')] == ['m.gguf.part00', 'm.gguf.part01']
  assert R.packaged_sha256('fake') == digest


def test_a_missing_part_package_or_a_wrong_sha256_is_refused_before_any_model_work(tmp_path, monkeypatch):
  _stand_in(tmp_path, monkeypatch, [b'GGUF-head', b'-tail'], sha256='0' * 64)
  with pytest.raises(EngramError, match=r'reader fake: the GGUF parts give sha256 .*expected 0000.*pip install fake'):
    R.dequantised_packaged('fake', tmp_path / 'cache')
  assert not (tmp_path / 'cache').exists()
  broken = R.PackagedGGUF('fake', 'm.gguf', (('nopkg_w31_absent', 'data/x'),), 'pip install fake')
  monkeypatch.setitem(R.PACKAGED, 'fake', broken)
  with pytest.raises(FileNotFoundError, match='package nopkg-w31-absent is not installed; install it with: pip'):
    R.packaged_parts('fake')


def test_the_chat_spec_is_unchanged_and_plain_specs_are_apart():
  chat = R.reader_spec('smollm2', 'gguf-sha256:x', 'float32', 'cpu', 'chat', 10)
  assert chat == {
    'reader': 'smollm2',
    'fingerprint': 'gguf-sha256:x',
    'dtype': 'float32',
    'decoding': 'greedy',
    'max_new_tokens': 10,
    'chat_template': True,
    'device_kind': 'cpu',
  }
  plain = R.reader_spec('gemma3_270m', 'gguf-sha256:x', 'float32', 'cuda:0', 'plain', 32)
  assert plain['prompt'] == 'plain' and plain['chat_template'] is False and plain['device_kind'] == 'cuda'


def test_an_unknown_reader_names_the_known_ones():
  with pytest.raises(EngramError, match='unknown reader .nope.: none, smollm2, gemma3_270m or hf'):
    R.load_reader('nope')
