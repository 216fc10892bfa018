"""Subcommands of the ``searchgym`` command line, one module each.

Each module defines ``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``,
and is listed in :data:`COMMANDS`. Modules import heavy packages inside ``run`` only.
"""

__all__ = ["COMMANDS"]

COMMANDS = ("envs", "eval", "index", "serve", "memory", "train", "study", "prepare", "models")
"""Module names under ``searchgym.commands``, in the order ``--help`` lists them."""
