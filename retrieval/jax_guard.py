"""Import a library with JAX hidden from it, so that the import cannot start JAX.

``bm25s.selection`` imports ``jax.lax`` when it can and runs ``jax.lax.top_k`` at import
time. That call starts JAX's backends, and on a GPU machine JAX's default is to take 75%
of every visible GPU's memory at that moment: next to a vLLM engine or a torch trainer, the
process then runs out of memory. searchgym only uses bm25s's numpy code, so it imports
bm25s while ``sys.modules`` names JAX as absent (``None``, which makes ``import jax`` raise
ImportError) and restores the entries right after. bm25s then records that JAX is not
available and never touches it.

Nothing about JAX itself changes: no environment variable is set, and a JAX the user
imported before or after keeps working as usual. The one visible effect is on bm25s when
imported through searchgym in a process: its ``backend="auto"`` top-k picks numpy.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

__all__ = ["HIDDEN", "import_without_jax"]

HIDDEN = ("jax", "jax.lax")
"""The module names that read as absent while the library is imported."""


def import_without_jax(name: str) -> ModuleType:
    """Import module ``name`` (and what it imports) with JAX reading as not installed.

    A module that is already imported is returned as it is: whoever imported it first
    decided how it saw JAX. The ``sys.modules`` entries of :data:`HIDDEN` are put back as
    they were, whether the import succeeds or fails.
    """
    module = sys.modules.get(name)
    if module is not None:
        return module
    saved = {key: sys.modules[key] for key in HIDDEN if key in sys.modules}
    try:
        for key in HIDDEN:
            sys.modules[key] = None  # type: ignore[assignment]  # the documented "absent" marker
        return importlib.import_module(name)
    finally:
        for key in HIDDEN:
            if key in saved:
                sys.modules[key] = saved[key]
            else:
                sys.modules.pop(key, None)
