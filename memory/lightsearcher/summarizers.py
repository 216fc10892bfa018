"""Choosing a summariser by name.

Three backends write LightSearcher's experience bank through the
:class:`~searchgym.memory.lightsearcher.bank.Summarizer` protocol:

- ``"rule"``: :class:`~searchgym.memory.lightsearcher.rule_summarizer.RuleBasedSummarizer` (the default),
  offline and deterministic, writing only contrasts it measured.
- ``"transformers:PATH"``: :class:`~searchgym.memory.lightsearcher.lm_summarizers.TransformersSummarizer`,
  a local causal language model.
- ``"openai:MODEL@URL"``: :class:`~searchgym.memory.lightsearcher.lm_summarizers.OpenAISummarizer`, an
  OpenAI-compatible chat-completions server.
"""

from __future__ import annotations

from ...error import InvalidArgumentError, UnknownNameError
from .bank import Summarizer
from .lm_summarizers import OpenAISummarizer, TransformersSummarizer
from .rule_summarizer import RuleBasedSummarizer

__all__ = ["make_summarizer"]

_FORMS = ("rule", "transformers:PATH", "openai:MODEL@URL")


def make_summarizer(spec: str | Summarizer) -> Summarizer:
    """A summariser from ``"rule"``, ``"transformers:PATH"``, ``"openai:MODEL@URL"`` or an object.

    An object with a ``summarize`` method is returned as it is; its ``name`` attribute,
    or else its class name, is what the bank history records
    (:func:`~searchgym.memory.lightsearcher.bank.summarizer_name`).

    Raises:
        UnknownNameError: an unknown name (with the accepted forms).
        InvalidArgumentError: a malformed ``openai:`` or ``transformers:`` spec.
    """
    if not isinstance(spec, str):
        if callable(getattr(spec, "summarize", None)):
            return spec
        raise InvalidArgumentError(
            f"summarizer must be one of {', '.join(_FORMS)} or an object with summarize(); got {spec!r}."
        )
    if spec == "rule":
        return RuleBasedSummarizer()
    if spec.startswith("transformers:"):
        return TransformersSummarizer(spec[len("transformers:") :])
    if spec.startswith("openai:"):
        model, at, url = spec[len("openai:") :].rpartition("@")
        if not at or not model or not url:
            raise InvalidArgumentError(
                f"An OpenAI summariser is written openai:MODEL@URL, e.g. openai:Qwen2.5-7B@http://127.0.0.1:8000/v1; got {spec!r}."
            )
        return OpenAISummarizer(url, model)
    raise UnknownNameError(f"Unknown summarizer {spec!r}. Known forms: {', '.join(_FORMS)}.")
