"""Range checks for settings that are not operator knobs (operator knobs are checked by their declarations,
:class:`engram_jax.ops.registry.Knob`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from engram_jax.core.errors import EngramError


def check_positive(options: Mapping[str, Any], *, where: str) -> None:
  """Every value of ``options`` must be a finite number > 0 (temperatures, learning rates, ...); a one-line
  ValueError naming ``where.<name>`` otherwise."""
  for name, value in options.items():
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
      raise EngramError(f'{where}.{name} must be a number > 0, got {value!r}')
