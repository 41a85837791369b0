"""Padded sizes: few distinct shapes, so that jit compiles few programs."""

from __future__ import annotations


def bucket(n: int, multiple: int) -> int:
  """Round ``n`` up so that jit compiles few shapes: to the next power of two while that is below ``multiple``
  (a LongMemEval episode with one question is not padded to 64), else to a multiple of ``multiple``."""
  if n <= multiple:
    return 1 << max(n - 1, 0).bit_length()
  return -(-n // multiple) * multiple
