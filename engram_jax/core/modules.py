"""The one importer of the modules a run or an artifact names (operators, components, dataset metrics, reports):
any failure of the import is one line naming who asked for the module and the module.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from types import ModuleType

from engram_jax.core.errors import EngramError


def import_module(name: str, where: str) -> ModuleType:
  """Import ``name`` for ``where`` (e.g. ``'ops_modules'``, an artifact's manifest); one line if it cannot be.

  >>> import_module('json', 'ops_modules').__name__
  'json'
  >>> import_module('no_such_module_here', 'ops_modules')
  Traceback (most recent call last):
  ...
  engram_jax.core.errors.EngramError: ops_modules: needs module 'no_such_module_here', which cannot be imported (ModuleNotFoundError: No module named 'no_such_module_here'); install it or put it on PYTHONPATH

  A module that is found and raises as it runs is named with its own error, not called missing.
  """
  try:
    return importlib.import_module(str(name))
  except ModuleNotFoundError as e:
    raise EngramError(
      f'{where}: needs module {name!r}, which cannot be imported ({type(e).__name__}: {e}); install it or put '
      'it on PYTHONPATH'
    ) from None
  except Exception as e:  # noqa: BLE001 - the module was found and failed as it ran (e.g. it registers a taken name)
    first = str(e).splitlines()[0] if str(e) else ''
    raise EngramError(f'{where}: {name!r}: {first} ({type(e).__name__} while importing it)') from None


def import_modules(names: Sequence[str], where: str) -> list[str]:
  """:func:`import_module` each of ``names`` in order; returns them."""
  names = [str(n) for n in names]
  for name in names:
    import_module(name, where)
  return names
