"""Frozen dataclasses that are JAX pytrees, without importing flax at start-up.

``flax.struct.dataclass`` did this for :class:`engram_jax.core.batch.EpisodeArrays` and
:class:`engram_jax.core.lexicon.Lexicon`, but importing flax (it pulls in ``flax.linen``, ``rich``, ...) cost ~0.2 s of
every process start (``python -X importtime -c "import experiments.evaluate"``), for nothing that JAX does not
have: :func:`jax.tree_util.register_dataclass` registers a dataclass whose fields are all children, in declaration
order, with attribute key paths, as flax's does. The fitter's own pytrees (``engram_jax.fit``) still use
``flax.struct``: the fitter imports flax anyway, and only when it runs.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

import jax

T = TypeVar('T')


def dataclass(cls: type[T]) -> type[T]:
  """``cls`` as a frozen dataclass registered as a pytree, every field a child, with ``replace(**changes)`` (as
  ``flax.struct.dataclass``)."""
  cls = dataclasses.dataclass(frozen=True)(cls)

  def replace(self: Any, **changes: Any) -> Any:
    return dataclasses.replace(self, **changes)

  cls.replace = replace  # type: ignore[attr-defined]
  return jax.tree_util.register_dataclass(cls, data_fields=[f.name for f in dataclasses.fields(cls)], meta_fields=[])
