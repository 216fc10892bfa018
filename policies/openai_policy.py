"""Any OpenAI-compatible chat-completions endpoint as a searchgym policy.

``--policy openai:MODEL@http://host:port/v1`` talks to a ``vllm serve`` (the papers'
setting), SGLang, or a hosted API, with the standard library only (``urllib``).
"""

from __future__ import annotations

import json
import logging
import os
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..checks import check_int, check_number
from ..envs.protocols import Protocol, make_protocol
from ..error import InvalidArgumentError, SearchGymError
from .base import Policy
from .chat import ChatFormatter, ContextTracker, resolve_stop_strings

__all__ = ["OpenAIPolicy", "EndpointError", "restore_stop"]

logger = logging.getLogger("searchgym.policies")

_ON_ERROR = ("raise", "empty")


class EndpointError(SearchGymError, RuntimeError):
    """A chat-completions endpoint gave no usable answer after every retry."""


def restore_stop(content: str, choice: Mapping[str, Any], stops: Sequence[str]) -> str:
    """Put back the stop string that an OpenAI-style server cut from ``content``.

    The API leaves the matched stop string out of the text, but the env needs the closing
    tag to read the action. In order: a text that already ends with a stop string is kept
    (``include_stop_str_in_output``); vLLM names the string in ``choice["stop_reason"]``
    (``None`` there means an end-of-sequence token, so nothing is added); a server without
    that field gets, when ``finish_reason`` is ``"stop"``, the closing tag of the latest
    ``<tag>`` left open in the text, if any.
    """
    if any(content.endswith(s) for s in stops):
        return content
    if "stop_reason" in choice:
        reason = choice["stop_reason"]
        return content + reason if isinstance(reason, str) and reason in stops else content
    if choice.get("finish_reason") != "stop":
        return content
    best, best_at = "", -1
    for stop in stops:
        if not stop.startswith("</"):
            continue
        at = content.rfind("<" + stop[2:])
        if at > best_at and content.find(stop, at) < 0:
            best, best_at = stop, at
    return content + best


class OpenAIPolicy(Policy):
    """A model behind ``POST {base_url}/chat/completions``, one request per context.

    Contexts are split into turns (:class:`ContextTracker`) and sent as chat messages
    (:meth:`ChatFormatter.messages`): the prompt as the user turn, earlier actions as
    assistant turns, observations as user (or tool) turns, so the server's chat template
    renders the same text :class:`ChatFormatter` writes for local models. The protocol's
    stop strings go in ``stop``; the one that fired is put back with :func:`restore_stop`.
    Up to ``max_concurrency`` requests run at once; actions come back in context order.

    Network errors, timeouts, HTTP 408, 429 and 5xx, and bodies that are not a chat
    completion are retried ``retries`` times with exponential back-off; any other HTTP
    status fails at once. A request that fails for good raises :class:`EndpointError`, or,
    with ``on_error="empty"``, logs a warning and yields an empty action (a format error
    in the env), so that a long evaluation survives a context the server rejects.

    Args:
        model: The model name the server expects.
        base_url: The API root, e.g. ``http://127.0.0.1:8000/v1``.
        protocol: The env's protocol; it sets the stop strings.
        max_new_tokens: ``max_tokens`` of each request.
        temperature, top_p: Sampling settings sent with each request.
        seed: Sent as ``seed`` when given.
        timeout: Seconds to wait for one answer (connect and read).
        retries: Extra attempts after a failed one.
        backoff: Seconds before the first retry (doubled each time).
        api_key: Bearer token (default: the ``OPENAI_API_KEY`` environment variable, if set).
        max_concurrency: Requests in flight at once.
        stop_strings: Replace the protocol's stop strings.
        system: System message before the first user turn.
        observation_role: ``"user"`` or ``"tool"``.
        extra_body: More request fields, e.g. ``{"include_stop_str_in_output": true}`` for vLLM.
        on_error: ``"raise"`` (default) or ``"empty"``.
        name: Policy name in result tables (default ``openai:MODEL@URL``).
    """

    def __init__(
        self,
        model: str,
        base_url: str,
        *,
        protocol: str | Protocol = "search_r1",
        max_new_tokens: int = 512,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int | None = None,
        timeout: float = 60.0,
        retries: int = 3,
        backoff: float = 0.5,
        api_key: str | None = None,
        max_concurrency: int = 8,
        stop_strings: Sequence[str] | None = None,
        system: str | None = None,
        observation_role: str = "user",
        extra_body: Mapping[str, Any] | None = None,
        on_error: str = "raise",
        name: str | None = None,
    ):
        if not isinstance(model, str) or not model.strip():
            raise InvalidArgumentError(f"model must be a non-empty string, got {model!r}.")
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise InvalidArgumentError(
                f"base_url must be an http(s) URL such as http://127.0.0.1:8000/v1, got {base_url!r}."
            )
        self.model = model
        self.base_url = base_url.rstrip("/")
        self.protocol = make_protocol(protocol)
        self.max_new_tokens = check_int("max_new_tokens", max_new_tokens, 1)
        self.temperature = check_number("temperature", temperature, 0)
        self.top_p = check_number("top_p", top_p, above=0)
        self.seed = check_int("seed", seed, 0, optional=True)
        self.timeout = check_number("timeout", timeout, above=0)
        self.retries = check_int("retries", retries, 0)
        self.backoff = check_number("backoff", backoff, 0)
        self.max_concurrency = check_int("max_concurrency", max_concurrency, 1)
        self.stop_strings = resolve_stop_strings(stop_strings, self.protocol)
        if extra_body is not None and not isinstance(extra_body, Mapping):
            raise InvalidArgumentError(f"extra_body must be a mapping of request fields, got {extra_body!r}.")
        self.extra_body = dict(extra_body or {})
        if on_error not in _ON_ERROR:
            raise InvalidArgumentError(f"on_error must be one of {', '.join(_ON_ERROR)}, got {on_error!r}.")
        self.on_error = on_error
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self.formatter = ChatFormatter(None, system=system, observation_role=observation_role)
        self.tracker = ContextTracker()
        self.name = name or f"openai:{model}@{self.base_url}"

    @property
    def url(self) -> str:
        """The chat-completions URL requests go to."""
        return f"{self.base_url}/chat/completions"

    def act(self, observations: Sequence[str]) -> list[str]:
        """One action per context, in order (see the class docstring)."""
        if isinstance(observations, str) or not all(isinstance(c, str) for c in observations):
            raise InvalidArgumentError(
                f"act expects a list of context strings, got {type(observations).__name__}."
            )
        splits = [self.tracker.split(context) for context in observations]
        requests = [self.formatter.messages(segments) for segments in splits]
        if len(requests) <= 1 or self.max_concurrency == 1:
            actions = [self._act_one(messages) for messages in requests]
        else:
            with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(requests))) as pool:
                actions = list(pool.map(self._act_one, requests))
        for context, segments, action in zip(observations, splits, actions, strict=True):
            self.tracker.record(context, action, segments)
        return actions

    def _act_one(self, messages: list[dict[str, str]]) -> str:
        try:
            return self.complete(messages)
        except EndpointError as exc:
            if self.on_error == "raise":
                raise
            logger.warning("%s: %s; the action is left empty.", self.name, exc)
            return ""

    def complete(self, messages: Sequence[Mapping[str, str]]) -> str:
        """The model's reply to ``messages``, its stop string restored.

        Raises:
            EndpointError: when every attempt failed (the message says how).
        """
        body: dict[str, Any] = {
            "model": self.model,
            "messages": list(messages),
            "max_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
        }
        if self.stop_strings:
            body["stop"] = self.stop_strings
        if self.seed is not None:
            body["seed"] = self.seed
        payload = json.dumps({**body, **self.extra_body}).encode("utf-8")
        last = ""
        for attempt in range(self.retries + 1):
            if attempt and self.backoff:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                raw = self._post(payload)
            except urllib.error.HTTPError as exc:
                detail = _read_error(exc)
                last = f"HTTP {exc.code} {exc.reason}{detail}"
                if exc.code in (408, 429) or exc.code >= 500:
                    continue
                raise EndpointError(f"{self.url} refused the request: {last}.") from None
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
                reason = getattr(exc, "reason", exc)
                last = f"no answer within {self.timeout:g} s" if "timed out" in str(reason) else str(reason)
                continue
            content, choice, problem = _read_completion(raw)
            if problem is None:
                return restore_stop(content, choice, self.stop_strings)
            last = problem
        raise EndpointError(f"{self.url} failed {self.retries + 1} time(s); last: {last}.")

    def _post(self, payload: bytes) -> bytes:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(self.url, data=payload, headers=headers, method="POST")
        with urllib.request.urlopen(request, timeout=self.timeout) as response:
            return response.read()

    def __repr__(self) -> str:
        return f"OpenAIPolicy({self.model!r}, {self.base_url!r}, protocol={self.protocol.name!r})"


def _read_error(exc: urllib.error.HTTPError) -> str:
    try:
        text = exc.read(300).decode("utf-8", "replace").strip()
    except Exception:  # noqa: BLE001 - the body is only a hint
        return ""
    return f": {text}" if text else ""


def _read_completion(raw: bytes) -> tuple[str, Mapping[str, Any], str | None]:
    """``(content, choice, None)`` for a chat completion, else ``("", {}, why not)``."""
    try:
        data = json.loads(raw)
        choice = data["choices"][0]
        content = choice["message"].get("content")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        return (
            "",
            {},
            f"the body is not a chat completion ({type(exc).__name__}: {exc}); it began {raw[:200]!r}",
        )
    if content is None:  # no text (e.g. an empty reply); the env reads it as a format error
        content = ""
    if not isinstance(content, str) or not isinstance(choice, Mapping):
        return "", {}, f"the message content is not text: {content!r:.200}"
    return content, choice, None
