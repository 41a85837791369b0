"""Test support: plain NumPy references of the operators (:mod:`engram_jax.testing.reference`), random padded
episodes (:mod:`engram_jax.testing.episodes`), synthetic embedded episodes (:mod:`engram_jax.testing.synthetic`) and
the operator contract (:func:`check_operator`, in :mod:`engram_jax.testing.operators`), which every registered
operator, built in or out of tree, must pass; the component contract (:func:`check_component`, in
:mod:`engram_jax.testing.components`), which every learned component must pass."""

from engram_jax.testing.components import check_component
from engram_jax.testing.operators import check_operator

__all__ = ['check_operator', 'check_component']
