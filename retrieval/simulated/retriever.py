"""A search engine simulated by a text generator (ZeroSearch / Light-Search training).

Each search asks a generator for documents instead of looking them up: one prompt per
document, all prompts of a batch of queries in one generator call. With probability
``noise_prob`` a document is requested as a deliberately unhelpful one, so a policy learns
to cope with poor results. The generator is any ``list[str] -> list[str]`` callable: a
local transformers model, an OpenAI-compatible endpoint (a vLLM server), a searchgym
policy, or, on SyntheticFacts,
:class:`~searchgym.envs.synthetic_docs.SyntheticDocGenerator`, which writes documents from the
world itself.

The noise draw of document ``j`` for query ``q`` is a hash of ``(seed, j, q)`` mapped to
[0, 1): reproducible across processes, batch sizes and call orders (a vector env and N
single envs see the same documents), and, over distinct queries, independent draws of
probability ``noise_prob``. The same query always gets the same draws, as a real engine
gives the same ranking; change ``seed`` (e.g. per epoch) for fresh ones.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ...checks import check_probability
from ...error import InvalidArgumentError, RetrievalError
from ..base import Retriever
from ..bm25 import MAX_QUERY_CHARS
from ..records import Doc

__all__ = [
    "MAX_DOC_CHARS",
    "DocRequest",
    "TextGenerator",
    "SimulatedRetriever",
    "make_simulated_retriever",
    "noise_draw",
    "parse_doc",
    "read_doc_prompt",
    "render_doc_prompt",
]

TextGenerator = Callable[[list[str]], list[str]]
"""Prompts in, one completion per prompt out."""

MAX_DOC_CHARS = 4000
"""A generated document's text is cut to this many characters."""

_USEFUL = (
    "You act as a web search engine. Write one short encyclopedia-style passage that a reader "
    "could use to answer the search query below. Give correct, specific facts in two to four "
    "plain sentences."
)
_NOISY = (
    "You act as a web search engine that returns a poor result. Write one short "
    "encyclopedia-style passage that looks related to the search query below but does not help "
    "answer it: it may be about a similar name or a nearby topic, or state a wrong fact. Two to "
    "four plain sentences."
)
_FORMAT = "Answer in exactly this form and nothing else:\nTitle: <page title>\nText: <passage>"
_QUERY_MARK = "\n\nSearch query: "
_SLOT_MARK = "\nResult "
_SLOT = re.compile(r"\nResult (\d+) of (\d+):\n\Z")

_THINK = re.compile(r"<think>.*?</think>", re.S | re.I)
_TITLE = re.compile(r"^[ \t*#_>-]*title[ \t*_]*[:：][ \t*_]*(?P<v>.*?)[ \t*_]*$", re.I | re.M)
_TEXT = re.compile(r"^[ \t*#_>-]*(?:text|content|passage|snippet)[ \t*_]*[:：][ \t*_]*", re.I | re.M)


@dataclass(frozen=True)
class DocRequest:
    """What one prompt asks for: result ``slot`` (0-based) of ``total`` for ``query``."""

    query: str
    noisy: bool
    slot: int = 0
    total: int = 1


def render_doc_prompt(request: DocRequest) -> str:
    """The prompt that asks a generator for one (useful or noisy) document."""
    head = _NOISY if request.noisy else _USEFUL
    return (
        f"{head}\n\n{_FORMAT}{_QUERY_MARK}{request.query}{_SLOT_MARK}{request.slot + 1} of {request.total}:\n"
    )


def read_doc_prompt(prompt: str) -> DocRequest | None:
    """Read back a prompt written by :func:`render_doc_prompt`; None for any other text."""
    if not isinstance(prompt, str):
        return None
    for head, noisy in ((_USEFUL, False), (_NOISY, True)):
        prefix = f"{head}\n\n{_FORMAT}{_QUERY_MARK}"
        if prompt.startswith(prefix):
            slot = _SLOT.search(prompt, len(prefix))
            if slot is None:
                return None
            query = prompt[len(prefix) : slot.start()]
            return DocRequest(query=query, noisy=noisy, slot=int(slot.group(1)) - 1, total=int(slot.group(2)))
    return None


def parse_doc(completion: object) -> tuple[str, str]:
    """``(title, text)`` from a generator's completion; never raises.

    Reads ``Title: ...`` and ``Text: ...`` lines (any case, with Markdown decorations such as
    ``**Title:**``; ``Content:``/``Passage:``/``Snippet:`` also count as the text line) and
    drops ``<think>...</think>`` blocks. Without a title line the whole completion becomes
    the text and the title is empty: junk output gives a document holding the raw text.
    Whitespace is collapsed (a document is one line) and the text cut to
    :data:`MAX_DOC_CHARS` characters.
    """
    if isinstance(completion, bytes):
        completion = completion.decode("utf-8", "replace")
    raw = completion if isinstance(completion, str) else ("" if completion is None else str(completion))
    raw = _THINK.sub(" ", raw).replace("<think>", " ").replace("</think>", " ")
    title_match = _TITLE.search(raw)
    if title_match is None:
        return "", " ".join(raw.split())[:MAX_DOC_CHARS]
    title = " ".join(title_match.group("v").split())[:200]
    rest = raw[title_match.end() :]
    text_match = _TEXT.search(rest)
    body = rest[text_match.end() :] if text_match else rest
    return title, " ".join(body.split())[:MAX_DOC_CHARS]


def noise_draw(seed: int, query: str, slot: int) -> float:
    """A uniform number in [0, 1) fixed by ``(seed, slot, query)``: document ``slot`` of
    ``query`` is noisy when it is below ``noise_prob``."""
    key = f"{seed}\x1f{slot}\x1f{query}".encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") / 2.0**64


def _as_generator(generator: object) -> TextGenerator:
    act = getattr(generator, "act", None)
    if callable(act):  # a searchgym Policy: contexts in, actions out
        return act  # type: ignore[no-any-return]
    if callable(generator):
        return generator  # type: ignore[return-value]
    raise InvalidArgumentError(
        f"generator must be a callable list[str] -> list[str] (or a Policy with .act), got "
        f"{type(generator).__name__}: {generator!r:.80}."
    )


class SimulatedRetriever(Retriever):
    """Documents written by a generator instead of retrieved from a corpus.

    ``search(queries, k)`` writes ``min(k, docs_per_query)`` documents per non-empty query
    (``k`` when ``docs_per_query`` is None) with one generator call for the whole batch.
    Document ``j`` of a query is requested as unhelpful when
    ``noise_draw(seed, query, j) < noise_prob``. Completions are parsed by
    :func:`parse_doc`; a document's id is ``"sim-"`` plus a hash of its title and text.

    Args:
        generator: ``list[str] -> list[str]`` (prompts in, completions out), or an object
            with such an ``act`` method (a searchgym policy).
        noise_prob: Chance that a document is requested as a noisy one, in [0, 1].
        docs_per_query: Cap on documents per query (None: ``k``).
        seed: Seed of the noise draws.

    Raises:
        InvalidArgumentError: A bad argument (at construction or in ``search``).
        RetrievalError: The generator raised, or returned other than one string-like
            completion per prompt.
    """

    name = "simulated"

    def __init__(
        self,
        generator: TextGenerator | Any,
        *,
        noise_prob: float = 0.0,
        docs_per_query: int | None = None,
        seed: int = 0,
    ) -> None:
        self._generate = _as_generator(generator)
        self.generator = generator
        self.noise_prob = check_probability("noise_prob", noise_prob)
        if docs_per_query is not None and (
            isinstance(docs_per_query, bool) or not isinstance(docs_per_query, int) or docs_per_query < 1
        ):
            raise InvalidArgumentError(f"docs_per_query must be None or an int >= 1, got {docs_per_query!r}.")
        self.docs_per_query = docs_per_query
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise InvalidArgumentError(f"seed must be an int, got {seed!r}.")
        self.seed = seed

    def is_noisy(self, query: str, slot: int) -> bool:
        """Whether document ``slot`` (0-based) of ``query`` is requested as a noisy one."""
        return noise_draw(self.seed, query[:MAX_QUERY_CHARS], slot) < self.noise_prob

    def requests(self, query: str, k: int) -> list[DocRequest]:
        """The documents one search for ``query`` asks for (empty for a blank query)."""
        if not query.strip():
            return []
        query = query[:MAX_QUERY_CHARS]
        total = k if self.docs_per_query is None else min(k, self.docs_per_query)
        return [DocRequest(query, self.is_noisy(query, j), j, total) for j in range(total)]

    def search(self, queries: Sequence[str], k: int) -> list[list[Doc]]:
        """Generated documents for each query, in slot order; see the class docstring."""
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise InvalidArgumentError(f"k must be a positive integer (documents per query), got {k!r}.")
        if isinstance(queries, str) or not isinstance(queries, (list, tuple)):
            raise InvalidArgumentError(f"queries must be a list or tuple of strings, got {queries!r:.80}.")
        bad = next((q for q in queries if not isinstance(q, str)), None)
        if bad is not None:
            raise InvalidArgumentError(
                f"queries must hold only strings, found {type(bad).__name__}: {bad!r:.60}."
            )
        per_query = [self.requests(q, k) for q in queries]
        prompts = [render_doc_prompt(r) for rs in per_query for r in rs]
        if not prompts:
            return [[] for _ in queries]
        try:
            completions = self._generate(prompts)
        except Exception as exc:  # a model or network failure is a retrieval failure
            raise RetrievalError(
                f"The document generator {type(self.generator).__name__} failed on {len(prompts)} prompts: {exc!r}"
            ) from exc
        if isinstance(completions, (str, bytes)) or not isinstance(completions, Sequence):
            raise RetrievalError(
                f"The document generator must return a list of strings, got {type(completions).__name__}."
            )
        if len(completions) != len(prompts):
            raise RetrievalError(
                f"The document generator returned {len(completions)} completions for {len(prompts)} prompts."
            )
        out: list[list[Doc]] = []
        it = iter(completions)
        for rs in per_query:
            docs = []
            for _ in rs:
                title, text = parse_doc(next(it))
                digest = hashlib.blake2b(f"{title}\x1f{text}".encode("utf-8", "surrogatepass"), digest_size=8)
                docs.append(Doc(id=f"sim-{digest.hexdigest()}", title=title, text=text))
            out.append(docs)
        return out

    def __len__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return (
            f"SimulatedRetriever({type(self.generator).__name__}, noise_prob={self.noise_prob}, "
            f"docs_per_query={self.docs_per_query}, seed={self.seed})"
        )


def make_simulated_retriever(
    *,
    corpus_path: object = None,
    docs: object = None,
    index_dir: object = None,
    generator: TextGenerator | Any = None,
    model: str | None = None,
    base_url: str | None = None,
    noise_prob: float = 0.0,
    docs_per_query: int | None = None,
    seed: int = 0,
    max_new_tokens: int = 256,
    timeout: float = 60.0,
    retries: int = 2,
    api_key: str | None = None,
) -> SimulatedRetriever:
    """The ``"simulated"`` factory of :func:`~searchgym.make_retriever`.

    The generator is, in order: ``generator`` if given; an OpenAI-compatible endpoint when
    ``base_url`` is given (``model`` names the served model); a local transformers model
    when only ``model`` is given (a path, a pulled offline model's name such as
    ``smollm2-135m-instruct``, or a hub name with network). SyntheticFacts envs pass the
    world's :class:`~searchgym.envs.synthetic_docs.SyntheticDocGenerator` when none of the
    three is set. A simulated engine has no corpus: ``corpus_path``, ``docs`` and
    ``index_dir`` are accepted (envs pass them) and ignored.

    Raises:
        InvalidArgumentError: No generator can be made from the arguments, or a bad argument.
    """
    del corpus_path, docs, index_dir
    if generator is None:
        from .generators import openai_generator, transformers_generator

        if base_url is not None:
            if not isinstance(model, str) or not model:
                raise InvalidArgumentError(
                    f"base_url={base_url!r} needs model=<the served model's name>, got model={model!r}."
                )
            generator = openai_generator(model, base_url, timeout=timeout, retries=retries, api_key=api_key)
        elif model is not None:
            from ...models import resolve_model

            generator = transformers_generator(resolve_model(model), max_new_tokens)
        else:
            raise InvalidArgumentError(
                "The simulated retriever needs a document generator: pass generator=<callable list[str] -> "
                "list[str]>, model=<local transformers model path>, or base_url=<OpenAI-compatible URL ending "
                "in /v1> with model=<name>. On searchgym/SyntheticFacts-v1 the world's own generator is the "
                "default."
            )
    return SimulatedRetriever(generator, noise_prob=noise_prob, docs_per_query=docs_per_query, seed=seed)
