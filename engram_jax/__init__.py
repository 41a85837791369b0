"""engram_jax: JAX retrieval operators, benchmarks and gradient fitting for long-memory retrieval.

Operators are pure functions over padded, masked arrays (callers ``jit``/``vmap``); loaders, metrics
and statistics are plain Python/NumPy. See README.md and the module docstrings.
"""

__version__ = '0.1.0'
