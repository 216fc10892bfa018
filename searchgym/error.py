"""The searchgym exception family (re-exported from ``searchgym.envs.errors``)."""

from searchgym.envs.errors import (
    DataFileError,
    InvalidArgumentError,
    RetrievalError,
    SearchGymError,
    UnknownNameError,
)

__all__ = ["SearchGymError", "UnknownNameError", "InvalidArgumentError", "DataFileError", "RetrievalError"]
