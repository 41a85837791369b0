"""``python -m experiments.bench``: see :mod:`experiments.bench.cli`."""

from experiments.bench.cli import main

if __name__ == '__main__':
  main()
