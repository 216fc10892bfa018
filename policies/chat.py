"""Chat formatting shared by every language-model policy and trainer.

An env speaks plain text: ``reset`` returns a prompt, each ``step`` returns an observation,
and a policy's running context is ``prompt + action + observation + action + ...``. A chat
model expects turns. :class:`ChatFormatter` maps one onto the other with the tokenizer's own
chat template, so that the text a model reads is the same in the built-in trainer, the
OpenRLHF agent, ``searchgym eval`` and deployment:

* ``prompt(text)``: the first user turn, rendered with the generation prompt (the model's
  input before its first action);
* ``feedback(observation)``: what follows an action: the end of the assistant turn, the
  observation as a user (or tool) turn, and the opening of the next assistant turn.

``prompt(p) + a1 + feedback(o1) + a2 + ...`` is exactly what the template renders for the
messages ``[user p, assistant a1, user o1, ...]`` with ``add_generation_prompt=True``. The
prompt and observations are stripped of surrounding white space inside turns; actions are
kept verbatim (they are the model's own tokens). Without a chat template both are the
identity, and the plain env text is the model's input.

:class:`ContextTracker` recovers those turns from the concatenated contexts that
:func:`searchgym.policies.evaluate` hands to ``Policy.act``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

from ..checks import check_int
from ..envs.protocols import Protocol, make_protocol
from ..error import InvalidArgumentError, SearchGymError

__all__ = ["ChatFormatter", "ContextTracker", "check_stop_strings", "resolve_stop_strings", "stop_strings"]

_OBSERVATION_ROLES = ("user", "tool")
_STOP_OVERRIDES: dict[str, tuple[str, ...]] = {
    # SEM's first turn is <think>…</think><answer>a1</answer> then maybe <search>q</search>:
    # stopping at </answer> would cut the search off, so only </search> stops generation
    # and an answer-only turn ends with the end-of-turn token.
    "sem": ("</search>",),
}
_DUMMY_USER = "U"
_DUMMY_ACTION = "A"


def check_stop_strings(name: str, value: Any) -> list[str]:
    """``value`` as a new list of stop strings, or an error that names ``name``.

    Any iterable of non-empty strings is accepted (a list, a tuple, a generator, which is
    read once); ``[]`` means no stop strings. A bare string is refused rather than read
    as its characters.

    Raises:
        InvalidArgumentError: ``value`` is a string, not iterable, or holds anything but
            non-empty strings.
    """
    items = None if isinstance(value, (str, bytes)) or not isinstance(value, Iterable) else list(value)
    if items is None or not all(isinstance(s, str) and s for s in items):
        raise InvalidArgumentError(
            f"{name} must be a list of non-empty strings, got {value!r}; "
            "pass e.g. ['</answer>'], or [] for none."
        )
    return items


def resolve_stop_strings(value: Iterable[str] | None, protocol: str | Protocol) -> list[str]:
    """The stop strings a policy generates with: ``value`` checked, or the protocol's if ``None``.

    Args:
        value: The policy's ``stop_strings`` argument.
        protocol: The env's protocol (a name or an instance).

    Raises:
        InvalidArgumentError: As :func:`check_stop_strings`.
    """
    return stop_strings(protocol) if value is None else check_stop_strings("stop_strings", value)


def stop_strings(protocol: str | Protocol) -> list[str]:
    """The strings that end a model's action under ``protocol``, for generation.

    A protocol object with a ``stop_strings`` attribute decides for itself. Otherwise they
    are the closing tags of the protocol's action tags: every tag except ``think`` and the
    tags the env itself writes into observations (``</search>`` and ``</answer>`` for
    ``search_r1`` and ``research``; ``</answer>`` and ``</tool_call>`` for ``tool_call``).
    ``sem`` stops at ``</search>`` only, since its first turn may go on after ``</answer>``.
    """
    proto = make_protocol(protocol)
    own = getattr(proto, "stop_strings", None)
    if own is not None:
        return check_stop_strings(f"{type(proto).__name__}.stop_strings", own)
    if proto.name in _STOP_OVERRIDES:
        return list(_STOP_OVERRIDES[proto.name])
    env_text = proto.render_docs([]) + proto.render_error("x")
    return [f"</{tag}>" for tag in proto.tags if tag != "think" and f"<{tag}>" not in env_text]


class ChatFormatter:
    """Renders env text as chat turns with a tokenizer's chat template.

    Args:
        tokenizer: A transformers tokenizer (anything with ``apply_chat_template`` and a
            ``chat_template``), or ``None``. Without a template the text passes unchanged.
        system: A system message put before the first user turn (default: none, so the
            template's own default, if any, applies).
        observation_role: ``"user"`` (default) or ``"tool"``: the role of observation
            turns. Qwen2.5's template wraps tool turns in ``<tool_response>`` tags itself,
            so ``user`` is right for protocols whose observations carry their own tags.

    Raises:
        InvalidArgumentError: for an unknown ``observation_role`` or a non-string system.
        SearchGymError: when the template does not render turns incrementally (a later
            message changes the text of earlier ones), so no feedback text exists.
    """

    def __init__(self, tokenizer: Any = None, *, system: str | None = None, observation_role: str = "user"):
        if observation_role not in _OBSERVATION_ROLES:
            raise InvalidArgumentError(
                f"observation_role must be one of {', '.join(_OBSERVATION_ROLES)}, got {observation_role!r}."
            )
        if system is not None and not isinstance(system, str):
            raise InvalidArgumentError(f"system must be a string or None, got {system!r}.")
        self.tokenizer = tokenizer
        self.system = system
        self.observation_role = observation_role

    @property
    def uses_template(self) -> bool:
        """Whether the tokenizer has a chat template (else the text is passed as is)."""
        return bool(getattr(self.tokenizer, "chat_template", None))

    stop_strings = staticmethod(stop_strings)

    def _render(self, messages: list[dict[str, str]], generation_prompt: bool) -> str:
        text = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt
        )
        if not isinstance(text, str):  # some versions wrap a single rendering in a list
            text = text[0]
        return text

    def _head(self, user: str) -> list[dict[str, str]]:
        head = [{"role": "system", "content": self.system}] if self.system is not None else []
        return head + [{"role": "user", "content": user}]

    def prompt(self, text: str) -> str:
        """The model's input before its first action: ``text`` as the first user turn."""
        if not self.uses_template:
            return text
        return self._render(self._head(text.strip()), generation_prompt=True)

    def feedback(self, observation: str) -> str:
        """The text that follows an action: ends the assistant turn, gives ``observation``
        as a user/tool turn, and opens the next assistant turn. Without a template, the
        observation itself."""
        if not self.uses_template:
            return observation
        head = self._head(_DUMMY_USER)
        before = self._render(head, generation_prompt=True) + _DUMMY_ACTION
        after = self._render(
            head
            + [
                {"role": "assistant", "content": _DUMMY_ACTION},
                {"role": self.observation_role, "content": observation.strip()},
            ],
            generation_prompt=True,
        )
        if not after.startswith(before):
            raise SearchGymError(
                "The tokenizer's chat template does not render turns incrementally: the text for "
                "[user, assistant] does not start the text for [user, assistant, "
                f"{self.observation_role}]. Pass a tokenizer whose template appends turns "
                "(Qwen2.5, Llama 3, ...) or observation_role='tool'/'user' to try the other role."
            )
        return after[len(before) :]

    def render(self, segments: Sequence[str]) -> str:
        """The model's input for ``[prompt, action, observation, action, ...]``."""
        if not segments:
            raise InvalidArgumentError("render needs at least the prompt segment, got an empty list.")
        parts = [self.prompt(segments[0])]
        for i, segment in enumerate(segments[1:], start=1):
            parts.append(segment if i % 2 else self.feedback(segment))
        return "".join(parts)

    def messages(self, segments: Sequence[str]) -> list[dict[str, str]]:
        """Chat messages for ``[prompt, action, observation, ...]`` (for chat-completion APIs).

        The same turns :meth:`render` writes: the optional system message, the stripped prompt
        as the user turn, actions verbatim as assistant turns, stripped observations in the
        observation role.
        """
        if not segments:
            raise InvalidArgumentError("messages needs at least the prompt segment, got an empty list.")
        out = self._head(segments[0].strip())
        for i, segment in enumerate(segments[1:], start=1):
            if i % 2:
                out.append({"role": "assistant", "content": segment})
            else:
                out.append({"role": self.observation_role, "content": segment.strip()})
        return out

    def __repr__(self) -> str:
        kind = type(self.tokenizer).__name__ if self.tokenizer is not None else "None"
        return f"ChatFormatter({kind}, template={self.uses_template}, observation_role={self.observation_role!r})"


class ContextTracker:
    """Splits running contexts back into ``[prompt, action, observation, ...]``.

    A policy calls :meth:`record` with each context and the action it chose; when the next
    context arrives (that text, the action, then the env's observation), :meth:`split`
    finds the longest recorded strict prefix and reads the observation after it. A context
    with no recorded prefix is a fresh prompt; so is a context equal to a recorded one (a
    new episode of the same question after an empty action). Keeps the latest ``capacity``
    records.

    Args:
        capacity: Records kept (least recently used ones are dropped first).
    """

    def __init__(self, capacity: int = 1024):
        self.capacity = check_int("capacity", capacity, 1)
        self._records: OrderedDict[str, tuple[str, ...]] = OrderedDict()

    def split(self, context: str) -> list[str]:
        """``[prompt, action, observation, ...]`` (odd length: it ends with the newest text)."""
        if not isinstance(context, str):
            raise InvalidArgumentError(f"A context must be a string, got {type(context).__name__}.")
        best = ""
        for key in self._records:  # a strict prefix: env observations between actions are never empty
            if len(best) < len(key) < len(context) and context.startswith(key):
                best = key
        if not best:
            return [context]
        self._records.move_to_end(best)
        return [*self._records[best], context[len(best) :]]

    def record(self, context: str, action: str, segments: Sequence[str] | None = None) -> None:
        """Remember that ``action`` was taken after ``context`` (split as ``segments`` if given)."""
        before = tuple(segments) if segments is not None else tuple(self.split(context))
        key = context + action
        self._records[key] = (*before, action)
        self._records.move_to_end(key)
        while len(self._records) > self.capacity:
            self._records.popitem(last=False)

    def __len__(self) -> int:
        return len(self._records)
