"""mkdocs hooks (``mkdocs.yml``): the build fails when the API reference misses a public name, as optax's does.

``python -m mkdocs build --strict`` (from the repository root, so that ``experiments`` imports) compares docs/api
with what ``python -m experiments.docs_site api`` writes from the ``__all__`` of every package, before building.
"""

from __future__ import annotations

from typing import Any

from mkdocs.exceptions import PluginError


def on_pre_build(config: Any, **kwargs: Any) -> None:
  from experiments import docs_site

  stale = docs_site.stale_api_pages()
  if stale:
    raise PluginError(
      f'the API reference is stale ({", ".join("docs/api/" + f for f in stale)}): a public name was added, renamed '
      'or removed; run python -m experiments.docs_site api'
    )
