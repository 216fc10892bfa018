"""The syllable name generator of the SyntheticFacts world."""

from __future__ import annotations

import random
from collections.abc import Callable

__all__ = ["MAX_COUNT", "make_names"]

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "h", "j", "th", "sh")
_FIRST_ONSETS = _ONSETS + ("br", "dr", "gr", "kr", "tr", "st", "cl", "fl")
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "o", "ai", "ei")
_CODAS = ("", "", "", "n", "r", "l", "s", "th", "m", "k", "nd", "x")
_COUNTRY_ENDINGS = ("ia", "land", "ovia", "aria", "esh", "mark", "ora")
_COMPANY_SUFFIXES = ("Systems", "Labs", "Works", "Group", "Industries", "Motors", "Foods", "Dynamics")
# Words a name part must not be: search stopwords and the words the templates use.
_RESERVED = frozenset(
    "into such that their then there these they this will with here more some same have made "
    "born city year country capital founder founded headquarters lies located birthplace".split()
)
MAX_COUNT = 5000
"""The most entities of one kind a world may have."""


def _word(rng: random.Random, syllables: int) -> str:
    """A capitalised pronounceable word: onset + vowel syllables, a coda on the last one."""
    body = "".join(
        rng.choice(_ONSETS if i else _FIRST_ONSETS) + rng.choice(_VOWELS) for i in range(syllables)
    )
    return (body + rng.choice(_CODAS)).capitalize()


def _fresh(rng: random.Random, used: set[str], make: Callable[[random.Random], str]) -> str:
    """Draw words with ``make(rng)`` until one is new (case-insensitively) and not reserved."""
    for _ in range(10_000):
        word = make(rng)
        if len(word) >= 3 and word.lower() not in used and word.lower() not in _RESERVED:
            used.add(word.lower())
            return word
    raise RuntimeError("The syllable generator ran out of fresh names; lower the entity counts.")


def make_names(seed: int, counts: dict[str, int]) -> dict[str, list[str]]:
    """Unique names per kind; every name part is unique in the whole world."""
    rng = random.Random(f"synthetic-facts/{seed}/names")
    used: set[str] = set()
    names: dict[str, list[str]] = {}
    names["country"] = [
        _fresh(rng, used, lambda r: _word(r, r.randint(1, 2)).rstrip("aeiou") + r.choice(_COUNTRY_ENDINGS))
        for _ in range(counts["country"])
    ]
    names["city"] = [_fresh(rng, used, lambda r: _word(r, r.randint(2, 3))) for _ in range(counts["city"])]
    names["person"] = [
        _fresh(rng, used, lambda r: _word(r, 2))
        + " "
        + _fresh(rng, used, lambda r: _word(r, r.randint(1, 2)))
        for _ in range(counts["person"])
    ]
    names["company"] = [
        _fresh(rng, used, lambda r: _word(r, r.randint(2, 3))) + " " + rng.choice(_COMPANY_SUFFIXES)
        for _ in range(counts["company"])
    ]
    return names
