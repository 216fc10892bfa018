"""A Gymnasium ``Text`` space that admits any string a language model can emit."""

from __future__ import annotations

import string

from gymnasium import spaces

__all__ = ["AnyText", "MAX_TEXT_LENGTH"]

MAX_TEXT_LENGTH = 10_000_000
"""Upper bound on observation and action length, in characters (ten million)."""

_SAMPLE_CHARSET = string.ascii_letters + string.digits + string.punctuation + " \n\téüßñ中文–“”"


class AnyText(spaces.Text):
    """Text space whose ``contains`` accepts every ``str`` up to ``max_length`` characters.

    Gymnasium's ``Text`` checks each character against a finite charset; model output can
    hold any Unicode, so membership here only checks the type and length. ``sample`` draws
    from printable ASCII plus a few non-ASCII characters, with length at most
    ``sample_max_length`` (a megabyte sample would make every random rollout slow).
    """

    def __init__(self, max_length: int = MAX_TEXT_LENGTH, sample_max_length: int = 256):
        super().__init__(max_length=max_length, min_length=0, charset=_SAMPLE_CHARSET)
        self.sample_max_length = sample_max_length

    def contains(self, x: object) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length

    def sample(self, mask=None, probability=None) -> str:  # type: ignore[override]
        if mask is None and probability is None:
            length = int(self.np_random.integers(0, self.sample_max_length + 1))
            mask = (length, None)
        return super().sample(mask=mask, probability=probability)

    def __repr__(self) -> str:
        return f"AnyText(max_length={self.max_length})"
