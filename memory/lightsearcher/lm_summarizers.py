"""Language-model summarisers: one prompt, one reply reader, two backends.

- :class:`TransformersSummarizer`: a local causal language model (``transformers``,
  imported when first used).
- :class:`OpenAISummarizer`: any OpenAI-compatible chat-completions server (vLLM in the
  papers' setting), over HTTP with ``urllib``.

Both ask for a revised bank with :func:`build_prompt` and read the reply with
:func:`parse_bank`, which takes bullet points under the three headings and raises
:class:`~searchgym.memory.lightsearcher.bank.SummarizerError` when the reply has none, so that junk never
replaces a bank.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from ...checks import check_int, check_number, check_string
from ...error import InvalidArgumentError
from .bank import ExperienceBank, SummarizerError, TrajectorySummary

__all__ = ["TransformersSummarizer", "OpenAISummarizer", "build_prompt", "parse_bank"]


# -- the prompt and its reader -------------------------------------------------------------------

_SYSTEM = (
    "You coach a question-answering agent that can call a search tool. From records of its "
    "past episodes you write short, practical rules that would help it score well next time."
)


def _clip(text: str | None, limit: int = 200) -> str:
    text = "" if text is None else " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _lines(summaries: Sequence[TrajectorySummary], limit: int) -> str:
    if not summaries:
        return "(none)"
    rows = []
    for i, s in enumerate(summaries[:limit], start=1):
        rows.append(
            f"{i}. Question: {_clip(s.question)} | answer: {_clip(s.answer) or '(none)'} | gold: "
            f"{_clip(s.gold[0] if s.gold else '')} | F1 {s.f1:.2f} | reward {s.reward:.2f} | "
            f"{s.num_searches} searches | {_clip(s.explanation, 300)}"
        )
    if len(summaries) > limit:
        rows.append(f"({len(summaries) - limit} more not shown)")
    return "\n".join(rows)


def build_prompt(
    good: Sequence[TrajectorySummary],
    bad: Sequence[TrajectorySummary],
    previous: ExperienceBank | None,
    max_examples: int = 8,
) -> tuple[str, str]:
    """``(system, user)`` messages asking a language model for a revised bank.

    At most ``max_examples`` episodes of each group are listed (the first ones given).
    """
    current = previous.to_text() if previous is not None and len(previous) else "(no guidance yet)"
    user = (
        "Here are recent episodes of the agent. Each line gives the question, the agent's final "
        "answer, the expected answer, the F1 score, the reward, the number of searches, and why "
        "the episode got that reward.\n\n"
        f"Episodes that scored well:\n{_lines(good, max_examples)}\n\n"
        f"Episodes that scored poorly:\n{_lines(bad, max_examples)}\n\n"
        f"Current guidance:\n{current}\n\n"
        "Compare the two sets: what did the good episodes do that the poor ones did not? Rewrite the "
        "guidance, keeping what still holds and dropping what the episodes contradict. Reply with "
        "three lists of short imperative bullet points (a line starting with '- ') under exactly "
        "these headings, and nothing else:\n"
        "Success strategies:\n- ...\nPitfalls to avoid:\n- ...\nReasoning guidelines:\n- ..."
    )
    return _SYSTEM, user


_BULLET = re.compile(r"^\s*(?:[-*•+]|\d{1,2}[.)])\s+(.+?)\s*$")
_HEADINGS = (
    ("success_strategies", ("success strateg", "strateg")),
    ("pitfalls", ("pitfall",)),
    ("reasoning_guidelines", ("reasoning guideline", "guideline")),
)


def _heading(line: str) -> str | None:
    cleaned = re.sub(r"[#*_`>:\s]+", " ", line).strip().lower()
    if not cleaned or len(cleaned) > 40:
        return None
    for name, prefixes in _HEADINGS:
        if any(cleaned.startswith(p) for p in prefixes):
            return name
    return None


def parse_bank(text: str, *, max_items: int = 8, max_item_chars: int = 400) -> ExperienceBank:
    """Read bullet points under the three headings of a model's reply.

    Headings may carry markdown (``## Pitfalls to avoid``, ``**Success strategies:**``);
    items are lines starting with ``-``, ``*``, ``•`` or ``1.``; items outside a heading,
    duplicates, and items shorter than 3 or longer than ``max_item_chars`` characters are
    dropped, and each group keeps at most ``max_items``.

    Raises:
        SummarizerError: no item was found (the reply is not a bank).
    """
    if not isinstance(text, str):
        raise SummarizerError(f"The model's reply must be text, got {type(text).__name__}.")
    out: dict[str, list[str]] = {name: [] for name, _ in ExperienceBank.GROUPS}
    current: str | None = None
    for line in text.splitlines():
        bullet = _BULLET.match(line)
        if bullet is None:
            heading = _heading(line)
            if heading is not None:
                current = heading
            continue
        if current is None:
            continue
        item = bullet.group(1).strip().strip("*_`").strip()
        if 3 <= len(item) <= max_item_chars and item not in out[current] and len(out[current]) < max_items:
            out[current].append(item)
    bank = ExperienceBank.from_groups(out)
    if not len(bank):
        raise SummarizerError(
            "The model's reply has no bullet points under the headings 'Success strategies', "
            f"'Pitfalls to avoid', 'Reasoning guidelines'; it began: {_clip(text, 200)!r}"
        )
    return bank


class _ChatSummarizer:
    """A summariser that sends :func:`build_prompt`'s two messages to ``generate`` and reads
    the reply with :func:`parse_bank`."""

    max_examples: int

    def generate(self, system: str, user: str) -> str:
        raise NotImplementedError

    def summarize(
        self,
        good: list[TrajectorySummary],
        bad: list[TrajectorySummary],
        previous: ExperienceBank | None = None,
    ) -> ExperienceBank:
        system, user = build_prompt(good, bad, previous, self.max_examples)
        return parse_bank(self.generate(system, user))


# -- a local transformers model ------------------------------------------------------------------


class TransformersSummarizer(_ChatSummarizer):
    """A local causal language model as the summariser (greedy decoding).

    ``transformers`` and ``torch`` are imported, and the model loaded, on the first call.
    The tokenizer's chat template is used when it has one; otherwise the system and user
    messages are joined as plain text.

    Args:
        model_path: A folder holding a model and tokenizer saved with ``save_pretrained``.
        max_new_tokens: Length limit of the reply.
        max_examples: Episodes of each group shown in the prompt.
        device: A torch device string (default ``"cpu"``).
    """

    def __init__(
        self, model_path: str, *, max_new_tokens: int = 384, max_examples: int = 8, device: str = "cpu"
    ):
        if not isinstance(model_path, str) or not model_path:
            raise InvalidArgumentError(f"model_path must be a non-empty folder path, got {model_path!r}.")
        self.model_path = model_path
        self.max_new_tokens = check_int("max_new_tokens", max_new_tokens, 1)
        self.max_examples = max_examples
        self.device = device
        self._model: Any = None
        self._tokenizer: Any = None

    @property
    def name(self) -> str:
        """``transformers:PATH``, recorded with every bank it writes."""
        return f"transformers:{self.model_path}"

    def _load(self) -> tuple[Any, Any]:
        if self._model is None:
            try:
                from transformers import AutoModelForCausalLM, AutoTokenizer
            except ImportError as exc:
                raise SummarizerError(
                    "TransformersSummarizer needs transformers and torch: pip install 'searchgym[train]'."
                ) from exc
            try:
                self._tokenizer = AutoTokenizer.from_pretrained(self.model_path)
                model: Any = AutoModelForCausalLM.from_pretrained(self.model_path)
                self._model = model.to(self.device).eval()
            except (OSError, ValueError) as exc:
                raise SummarizerError(f"Cannot load a causal LM from {self.model_path!r}: {exc}") from exc
        return self._tokenizer, self._model

    def generate(self, system: str, user: str) -> str:
        """The model's reply to the two messages."""
        import torch

        tokenizer, model = self._load()
        if getattr(tokenizer, "chat_template", None):
            messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        else:
            text = f"{system}\n\n{user}\n\n"
        ids = tokenizer(text, return_tensors="pt").input_ids.to(self.device)
        limit = getattr(model.config, "max_position_embeddings", None)
        if limit is not None and ids.shape[1] + self.max_new_tokens > limit:
            raise SummarizerError(
                f"The prompt has {ids.shape[1]} tokens and the reply may take {self.max_new_tokens}, beyond "
                f"the model's {limit}: lower max_examples or max_new_tokens."
            )
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        with torch.no_grad():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=self.max_new_tokens,
                do_sample=False,
                pad_token_id=pad,
            )
        return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)

    def __repr__(self) -> str:
        return f"TransformersSummarizer({self.model_path!r})"


# -- an OpenAI-compatible server -----------------------------------------------------------------


class OpenAISummarizer(_ChatSummarizer):
    """An OpenAI-compatible chat-completions endpoint as the summariser (e.g. vLLM's server).

    Sends ``POST {base_url}/chat/completions`` with ``urllib``. Network errors, timeouts,
    HTTP 429 and 5xx are retried ``retries`` times with exponential back-off; any other
    HTTP error, or a body that is not a chat completion, fails at once. Every failure
    raises :class:`SummarizerError`, which leaves the current bank in place.

    Args:
        base_url: The API root, e.g. ``http://127.0.0.1:8000/v1``.
        model: The model name the server expects.
        timeout: Seconds to wait for one answer.
        retries: Extra attempts after a failed one.
        api_key: Sent as a bearer token when given.
        max_tokens, temperature: Generation settings sent with the request.
        backoff: Seconds before the first retry (doubled each time).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        timeout: float = 60.0,
        retries: int = 2,
        api_key: str | None = None,
        max_tokens: int = 512,
        temperature: float = 0.0,
        max_examples: int = 8,
        backoff: float = 1.0,
    ):
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise InvalidArgumentError(
                f"base_url must be an http(s) URL such as http://127.0.0.1:8000/v1, got {base_url!r}."
            )
        check_string("model", model)
        check_number("timeout", timeout, above=0, note=" (seconds)")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.timeout = float(timeout)
        self.retries = check_int("retries", retries, 0)
        self.api_key = api_key
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.max_examples = max_examples
        self.backoff = backoff

    @property
    def name(self) -> str:
        """``openai:MODEL@URL``, recorded with every bank it writes."""
        return f"openai:{self.model}@{self.base_url}"

    def _post(self, body: bytes) -> bytes:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(f"{self.base_url}/chat/completions", data=body, headers=headers)
        with urllib.request.urlopen(request, timeout=self.timeout) as response:
            return response.read()

    def generate(self, system: str, user: str) -> str:
        """The text of the server's reply to the two messages."""
        body = json.dumps(
            {
                "model": self.model,
                "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
                "max_tokens": self.max_tokens,
                "temperature": self.temperature,
            }
        ).encode("utf-8")
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                raw = self._post(body)
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code} {exc.reason}"
                if exc.code == 429 or exc.code >= 500:
                    continue
                raise SummarizerError(
                    f"{self.base_url}/chat/completions refused the request: {last}."
                ) from exc
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
                reason = getattr(exc, "reason", exc)
                last = f"no answer within {self.timeout:g} s" if "timed out" in str(reason) else str(reason)
                continue
            return self._content(raw)
        raise SummarizerError(
            f"{self.base_url}/chat/completions failed {self.retries + 1} times; last: {last}."
        )

    def _content(self, raw: bytes) -> str:
        try:
            data = json.loads(raw)
            content = data["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise SummarizerError(
                f"{self.base_url}/chat/completions sent something that is not a chat completion "
                f"({type(exc).__name__}: {exc}); it began: {raw[:200]!r}"
            ) from None
        if not isinstance(content, str):
            raise SummarizerError(f"The completion's message content is not text: {content!r}.")
        return content

    def __repr__(self) -> str:
        return f"OpenAISummarizer({self.base_url!r}, {self.model!r})"
