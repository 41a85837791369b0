"""Shared test settings: a deterministic hypothesis profile (as JAX's own test_util) and float64 for refs."""

import os

import hypothesis
import jax

hypothesis.settings.register_profile(
    'deterministic', database=None, derandomize=True, deadline=None, max_examples=40,
    suppress_health_check=[hypothesis.HealthCheck.too_slow])
hypothesis.settings.load_profile(os.environ.get('HYPOTHESIS_PROFILE', 'deterministic'))

jax.config.update('jax_enable_x64', True)
