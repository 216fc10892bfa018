"""Subcommands of the ``searchgym`` command line, one module each.

Each module defines ``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``,
and is listed in :data:`COMMANDS`. Modules import heavy packages inside ``run`` only.
"""

__all__ = ["COMMANDS", "log_to_stderr"]

COMMANDS = (
    "envs",
    "eval",
    "index",
    "serve",
    "memory",
    "train",
    "config",
    "plot",
    "study",
    "prepare",
    "data",
    "models",
)
"""Module names under ``searchgym.commands``, in the order ``--help`` lists them."""


def log_to_stderr(name: str, prefix: str = "") -> None:
    """Print the INFO records of logger ``name`` to standard error, one line each, unless the
    logger already has a handler. Each line goes to ``sys.stderr`` as it is when the record is
    emitted (a handler bound at setup would keep writing to a stream since replaced)."""
    import logging
    import sys

    class _Stderr(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            try:
                print(self.format(record), file=sys.stderr)
            except Exception:  # noqa: BLE001  (logging's own convention)
                self.handleError(record)

    logger = logging.getLogger(name)
    if not logger.handlers:
        handler = _Stderr()
        handler.setFormatter(logging.Formatter(prefix + "%(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
