"""Dataset loaders: plain Python/NumPy, validating, reporting every normalisation."""
