"""Shared test settings: a deterministic hypothesis profile (as JAX's own test_util) and float64 for refs."""

import os

import hypothesis
import jax

hypothesis.settings.register_profile(
  'deterministic',
  database=None,
  derandomize=True,
  deadline=None,
  max_examples=40,
  suppress_health_check=[hypothesis.HealthCheck.too_slow],
)
# The fast tier (-m 'not slow', the edit-test loop) tries each property on 10 examples instead of 40.
hypothesis.settings.register_profile('fast', hypothesis.settings.get_profile('deterministic'), max_examples=10)
hypothesis.settings.load_profile(os.environ.get('HYPOTHESIS_PROFILE', 'deterministic'))


def pytest_configure(config):
  """``-m 'not slow'`` loads the ``fast`` hypothesis profile, unless ``HYPOTHESIS_PROFILE`` names one."""
  if ' '.join(config.getoption('markexpr', '').split()) == 'not slow' and 'HYPOTHESIS_PROFILE' not in os.environ:
    hypothesis.settings.load_profile('fast')


jax.config.update('jax_enable_x64', True)
# One CPU device per test process, whatever runs first: the entry points' eval.cpu_devices takes effect only before
# JAX's first computation, which this is (tests that need several devices fake them in a subprocess).
jax.devices()
