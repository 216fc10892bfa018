"""Simulated search: documents written by a text generator instead of retrieved.

``make_retriever("simulated", generator=..., noise_prob=0.2)``, or in an env
``retriever="simulated", retriever_kwargs={...}`` (see :func:`make_simulated_retriever`).
Nothing heavy is imported here: torch and transformers load on the first call of a
:class:`TransformersGenerator`.
"""

from __future__ import annotations

from .generators import OpenAIChatGenerator, TransformersGenerator, openai_generator, transformers_generator
from .retriever import (
    MAX_DOC_CHARS,
    DocRequest,
    SimulatedRetriever,
    TextGenerator,
    make_simulated_retriever,
    noise_draw,
    parse_doc,
    read_doc_prompt,
    render_doc_prompt,
)

__all__ = [
    # the retriever
    "SimulatedRetriever",
    "make_simulated_retriever",
    "TextGenerator",
    # generators
    "TransformersGenerator",
    "OpenAIChatGenerator",
    "transformers_generator",
    "openai_generator",
    # prompts and parsing
    "DocRequest",
    "MAX_DOC_CHARS",
    "noise_draw",
    "parse_doc",
    "read_doc_prompt",
    "render_doc_prompt",
]
