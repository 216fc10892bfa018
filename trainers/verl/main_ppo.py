"""``python -m searchgym.trainers.verl.main_ppo OVERRIDES``: verl's ``main_ppo`` with searchgym's patches.

It sets the environment variables that the overrides put in the Ray runtime env
(``+ray_kwargs.ray_init.runtime_env.env_vars.NAME=VALUE``) in this process too, installs the
worker hook's patches (:func:`searchgym.trainers.verl.hook.setup`) in this
process too, then runs ``verl.trainer.main_ppo`` as ``__main__`` with the same Hydra
overrides. The runtime env the overrides carry installs them in the Ray workers, where the
trainer runs.
"""

from __future__ import annotations

import runpy
import sys

__all__ = ["main"]


def main(argv: list[str] | None = None) -> None:
    """Install the patches, then run ``verl.trainer.main_ppo`` with ``argv`` (default: ``sys.argv[1:]``)."""
    import os

    from .hook import setup

    overrides = sys.argv[1:] if argv is None else argv
    prefix = "+ray_kwargs.ray_init.runtime_env.env_vars."
    for override in overrides:
        if override.startswith(prefix) and "=" in override:
            name, value = override[len(prefix) :].split("=", 1)
            os.environ.setdefault(name, value.strip("'"))
    setup()
    sys.argv = ["verl.trainer.main_ppo", *overrides]
    runpy.run_module("verl.trainer.main_ppo", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
