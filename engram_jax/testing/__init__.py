"""Test support: plain NumPy references of the operators (:mod:`engram_jax.testing.reference`)."""
