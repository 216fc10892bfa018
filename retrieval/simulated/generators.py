"""Text generators for the simulated search engine: a local transformers model, or an
OpenAI-compatible chat endpoint (a vLLM or SGLang server, or a hosted API).

Both are picklable callables ``list[str] -> list[str]``. torch and transformers are imported
on the first call, never at import time; the endpoint client uses only the standard library.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ...checks import check_int, check_number
from ...error import InvalidArgumentError, RetrievalError

__all__ = ["OpenAIChatGenerator", "TransformersGenerator", "openai_generator", "transformers_generator"]


class TransformersGenerator:
    """Greedy (or sampled) generation with a causal LM from ``transformers``.

    The model and tokenizer load on the first call, from a local folder (offline) or a hub
    name. Prompts go through the tokenizer's chat template when it has one, are padded on
    the left, and run ``batch_size`` at a time; only the new tokens are decoded.

    Args:
        model_path: A local model folder, or a hub name (needs network).
        max_new_tokens: Tokens generated per document.
        batch_size: Prompts per ``generate`` call.
        temperature: 0 for greedy decoding (deterministic), else sampling temperature.
        device: ``"cpu"``, ``"cuda"``, ...; default CUDA when available.
        max_prompt_tokens: Cut longer prompts from the left (the query is at the end).
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        max_new_tokens: int = 256,
        *,
        batch_size: int = 8,
        temperature: float = 0.0,
        device: str | None = None,
        max_prompt_tokens: int | None = None,
    ) -> None:
        if not isinstance(model_path, (str, os.PathLike)) or not str(model_path):
            raise InvalidArgumentError(f"model_path must be a model folder or hub name, got {model_path!r}.")
        self.model_path = str(model_path)
        self.max_new_tokens = check_int("max_new_tokens", max_new_tokens, 1)
        self.batch_size = check_int("batch_size", batch_size, 1)
        self.temperature = check_number("temperature", temperature, 0.0)
        self.device = device
        self.max_prompt_tokens = (
            None if max_prompt_tokens is None else check_int("max_prompt_tokens", max_prompt_tokens, 1)
        )
        self._model: Any = None
        self._tokenizer: Any = None

    def __getstate__(self) -> dict[str, Any]:  # ship the settings, not the weights
        return {**self.__dict__, "_model": None, "_tokenizer": None}

    def _load(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        local = Path(self.model_path).is_dir()
        try:
            tokenizer = AutoTokenizer.from_pretrained(self.model_path, local_files_only=local)
            model = AutoModelForCausalLM.from_pretrained(self.model_path, local_files_only=local)
        except (OSError, ValueError) as exc:
            raise InvalidArgumentError(
                f"Cannot load a causal language model from {self.model_path!r} ({exc}). Pass the folder of a "
                "model saved with save_pretrained (config, weights, tokenizer), or a hub name with network."
            ) from exc
        tokenizer.padding_side = "left"
        tokenizer.truncation_side = "left"
        if tokenizer.pad_token is None:
            if tokenizer.eos_token is None:
                raise InvalidArgumentError(
                    f"The tokenizer of {self.model_path!r} has neither a pad nor an eos token; add one."
                )
            tokenizer.pad_token = tokenizer.eos_token
        device = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
        self._model, self._tokenizer = model.to(device).eval(), tokenizer  # type: ignore[arg-type]

    def _format(self, prompt: str) -> str:
        if getattr(self._tokenizer, "chat_template", None):
            messages = [{"role": "user", "content": prompt}]
            return str(
                self._tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            )
        return prompt

    def __call__(self, prompts: Sequence[str]) -> list[str]:
        """One completion per prompt."""
        import torch

        if self._model is None:
            self._load()
        completions: list[str] = []
        for start in range(0, len(prompts), self.batch_size):
            chunk = [self._format(p) for p in prompts[start : start + self.batch_size]]
            cut = self.max_prompt_tokens is not None
            batch = self._tokenizer(
                chunk, return_tensors="pt", padding=True, truncation=cut, max_length=self.max_prompt_tokens
            ).to(self._model.device)
            batch.pop("token_type_ids", None)
            options: dict[str, Any] = {
                "max_new_tokens": self.max_new_tokens,
                "pad_token_id": self._tokenizer.pad_token_id,
            }
            if self.temperature > 0:
                options.update(do_sample=True, temperature=self.temperature)
            else:
                options.update(do_sample=False)
            with torch.no_grad():
                output = self._model.generate(**batch, **options)
            new_tokens = output[:, batch["input_ids"].shape[1] :]
            completions.extend(self._tokenizer.batch_decode(new_tokens, skip_special_tokens=True))
        return completions

    def __repr__(self) -> str:
        return f"TransformersGenerator({self.model_path!r}, max_new_tokens={self.max_new_tokens})"


class OpenAIChatGenerator:
    """Completions from an OpenAI-compatible ``/chat/completions`` endpoint (urllib only).

    Each prompt is one user message; up to ``concurrency`` requests run at once. A failed
    request (connection error, timeout, HTTP 429 or 5xx, or an answer that is not a chat
    completion) is retried ``retries`` times with exponential backoff; other 4xx answers
    are not retried. When a prompt still fails, the call raises
    :class:`~searchgym.error.RetrievalError`, which an env turns into an error observation.

    Args:
        model: The served model's name.
        base_url: The API root, e.g. ``http://127.0.0.1:8000/v1`` (``/chat/completions`` is
            appended unless already there).
        timeout: Seconds per request. retries: Extra attempts per prompt.
        api_key: Sent as a bearer token; default ``$OPENAI_API_KEY`` if set, else none.
        max_tokens: Tokens per document. temperature: Sampling temperature (0: greedy).
        concurrency: Requests in flight at once. backoff: First retry delay, in seconds.
    """

    def __init__(
        self,
        model: str,
        base_url: str,
        *,
        timeout: float = 60.0,
        retries: int = 2,
        api_key: str | None = None,
        max_tokens: int = 256,
        temperature: float = 0.0,
        concurrency: int = 8,
        backoff: float = 0.5,
    ) -> None:
        if not isinstance(model, str) or not model:
            raise InvalidArgumentError(f"model must be the served model's name, got {model!r}.")
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise InvalidArgumentError(f"base_url must look like 'http://host:port/v1', got {base_url!r}.")
        url = base_url.rstrip("/")
        self.url = url if url.endswith("/chat/completions") else f"{url}/chat/completions"
        self.model = model
        self.timeout = check_number("timeout", timeout, above=0.0)
        self.retries = check_int("retries", retries, 0)
        self.max_tokens = check_int("max_tokens", max_tokens, 1)
        self.temperature = check_number("temperature", temperature, 0.0)
        self.concurrency = check_int("concurrency", concurrency, 1)
        self.backoff = check_number("backoff", backoff, 0.0)
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")

    def __call__(self, prompts: Sequence[str]) -> list[str]:
        """One completion per prompt, in order."""
        if not prompts:
            return []
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(prompts))) as pool:
            return list(pool.map(self._complete, prompts))

    def _complete(self, prompt: str) -> str:
        body = json.dumps(
            {
                "model": self.model,
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": self.max_tokens,
                "temperature": self.temperature,
            }
        ).encode("utf-8", "surrogatepass")
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        problem, payload = "", None
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    payload = json.loads(response.read())
                content = payload["choices"][0]["message"]["content"]
                return "" if content is None else str(content)
            except urllib.error.HTTPError as exc:
                detail = exc.read(300).decode("utf-8", "replace") if exc.fp is not None else ""
                problem = f"HTTP {exc.code} {detail!r}"
                if 400 <= exc.code < 500 and exc.code not in (408, 429):
                    break  # the request itself is wrong: retrying will not help
            except (OSError, ValueError) as exc:  # URLError, timeouts, resets, bad JSON
                problem = repr(exc)
            except (KeyError, IndexError, TypeError):
                problem = f"not a chat completion: {str(payload)[:200]!r}"
        raise RetrievalError(
            f"The chat endpoint {self.url} failed for model {self.model!r}: {problem}. Check that the server "
            "is up and serves this model."
        )

    def __repr__(self) -> str:
        return f"OpenAIChatGenerator({self.model!r}, {self.url!r})"


def transformers_generator(
    model_path: str | os.PathLike[str], max_new_tokens: int = 256, **kwargs: Any
) -> TransformersGenerator:
    """A :class:`TransformersGenerator` (loaded lazily, on first use)."""
    return TransformersGenerator(model_path, max_new_tokens, **kwargs)


def openai_generator(
    model: str, base_url: str, timeout: float = 60.0, retries: int = 2, **kwargs: Any
) -> OpenAIChatGenerator:
    """An :class:`OpenAIChatGenerator` for ``base_url`` (e.g. ``http://127.0.0.1:8000/v1``)."""
    return OpenAIChatGenerator(model, base_url, timeout=timeout, retries=retries, **kwargs)
