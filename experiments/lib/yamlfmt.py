"""``OmegaConf.to_yaml``, byte for byte, emitted by libyaml.

``OmegaConf.to_yaml`` turns a config into a container and dumps it through PyYAML's pure-Python emitter: ~12 ms for
a run's resolved configuration, and ~25 ms for the three ``.hydra`` files of a sweep job, a sixth of a LoCoMo fusion
sweep job. :func:`to_yaml` dumps the same container with the same settings and OmegaConf's own representers (its
rule that quotes strings YAML would read as bools or numbers) through libyaml's C emitter when PyYAML has it
(``yaml.__with_libyaml__``), else calls ``OmegaConf.to_yaml``.

The two emitters differ on a few inputs (found by the tests): libyaml escapes characters outside the Basic
Multilingual Plane and ``\x85`` that PyYAML writes as they are (``allow_unicode``), writes an empty key as a simple
key where PyYAML writes ``? ''``, and their limits on a simple key's length differ (PyYAML: 122 characters, as it
counts the implicit ``!!str`` tag; libyaml: 128 bytes). A
container with such a string (:func:`_same_in_both`) is dumped by ``OmegaConf.to_yaml`` itself. ``tests/experiments/test_yamlfmt.py`` checks the text equal on
random trees (unicode, long and multi-line strings, strings that look like numbers, bools or null, special floats,
empty containers) and on every composed configuration of a sweep.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import yaml
from omegaconf import OmegaConf


@functools.cache
def c_dumper() -> type | None:
  """A libyaml-emitting dumper with OmegaConf's representers, or None when PyYAML was built without libyaml."""
  if not getattr(yaml, '__with_libyaml__', False):
    return None
  try:  # OmegaConf's own dumper class (private; an OmegaConf without it: to_yaml falls back to OmegaConf.to_yaml)
    from omegaconf._utils import get_omega_conf_dumper
  except ImportError:
    return None
  py = get_omega_conf_dumper()
  return type(
    'OmegaConfCDumper',
    (yaml.CDumper,),
    {'yaml_representers': dict(py.yaml_representers), 'yaml_multi_representers': dict(py.yaml_multi_representers)},
  )


# characters both emitters write as they are (PyYAML: printable and, with allow_unicode, the unicode range; libyaml:
# its IS_PRINTABLE), less the line and paragraph separators
_KEY_BYTES = 100  # longer keys: the emitters' simple-key limits differ (PyYAML counts the implicit '!!str' tag too)
_PLAIN = re.compile('[\n\x20-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufefe\uff00-\ufffd]*')


def _same_in_both(o: Any) -> bool:
  """Whether both emitters write every string of the container ``o`` alike (module docstring)."""
  if isinstance(o, str):
    return _PLAIN.fullmatch(o) is not None
  if isinstance(o, dict):
    for k, v in o.items():
      if isinstance(k, str) and (not k or '\n' in k or len(k.encode()) > _KEY_BYTES or not _same_in_both(k)):
        return False
      if not _same_in_both(v):
        return False
    return True
  if isinstance(o, (list, tuple)):
    return all(_same_in_both(v) for v in o)
  return True


def to_yaml(cfg: Any, *, resolve: bool = False) -> str:
  """``OmegaConf.to_yaml(cfg, resolve=resolve)`` (keys in order), through libyaml when both emitters agree."""
  dumper = c_dumper()
  if dumper is None:
    return OmegaConf.to_yaml(cfg, resolve=resolve)
  container = OmegaConf.to_container(cfg, resolve=resolve, enum_to_str=True)
  if not _same_in_both(container):
    return OmegaConf.to_yaml(cfg, resolve=resolve)
  return yaml.dump(container, default_flow_style=False, allow_unicode=True, sort_keys=False, Dumper=dumper)
