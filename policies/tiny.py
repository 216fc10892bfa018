"""A tiny causal language model built offline, for tests, CPU runs and examples.

:func:`build_tiny_lm` trains a byte-level BPE tokenizer with ``tokenizers`` on searchgym
text (by default: SyntheticFacts passages and questions of worlds other than the default
one, every protocol's instructions, and sample actions and observations), gives it a
Qwen2.5-style chat template (``<|im_start|>role\\n…<|im_end|>``), and saves it beside a
randomly initialised ``LlamaForCausalLM``. Nothing is downloaded. The model's text is junk
until it is trained; that is what the envs and trainers are tested against. Weights are
drawn with standard deviation 0.1 (not transformers' 0.02), which makes greedy decoding
produce varied junk instead of repeating one token, and keeps argmax ties (and with them
batch-dependent outputs) unlikely.

Reload with :func:`load_tiny_lm` (or :func:`load_tokenizer`), which uses
``PreTrainedTokenizerFast``: ``AutoTokenizer`` may pick a model-specific class that
tokenises the saved vocabulary differently.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..checks import check_int
from ..error import InvalidArgumentError, SearchGymError
from .cached_folder import build_once

__all__ = ["build_tiny_lm", "load_tiny_lm", "load_tokenizer", "default_texts", "TINY_CHAT_TEMPLATE"]

_FORMAT_VERSION = 1
_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_DONE = "searchgym_tiny_lm.json"

TINY_CHAT_TEMPLATE = (
    "{%- if messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' and loop.first %}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""Qwen2.5's turn layout (default system message, tool turns grouped in a user turn and
wrapped in ``<tool_response>``), without its tool-schema preamble."""


def default_texts() -> list[str]:
    """Training text for the tiny tokenizer: searchgym's own vocabulary.

    SyntheticFacts passages and questions of worlds 1001-1003 (not the default world 0),
    every registered protocol's instructions, and one search action, one answer action and
    one observation per protocol.
    """
    from ..envs.protocols import PROTOCOLS, make_protocol
    from ..envs.synthetic import generate_world

    texts: list[str] = []
    for seed in (1001, 1002, 1003):
        world = generate_world(seed)
        texts += [doc.text for doc in world.docs] + [q.question for q in world.questions]
        docs = list(world.docs[:3])
        for name in sorted(PROTOCOLS):
            protocol = make_protocol(name)
            question = world.questions[0]
            texts.append(protocol.render_prompt(question.question))
            texts.append(protocol.render_docs(docs))
            if name == "sem":
                texts.append(
                    protocol.write_action(query=question.question, answer="unknown", think="Let me check.")
                )
            else:
                texts.append(protocol.write_action(query=question.question, think="I should search."))
            texts.append(protocol.write_action(answer=question.golden_answers[0], think="I know it."))
    return texts


def _cache_key(texts: list[str] | None, settings: dict[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps({**settings, "version": _FORMAT_VERSION}, sort_keys=True).encode())
    if texts is not None:
        for text in texts:
            digest.update(b"\0" + text.encode("utf-8", "surrogatepass"))
    return digest.hexdigest()[:16]


def build_tiny_lm(
    out_dir: str | os.PathLike[str],
    *,
    texts: Iterable[str] | None = None,
    vocab_size: int = 1000,
    hidden_size: int = 128,
    num_layers: int = 4,
    chat_template: bool = True,
    seed: int = 0,
) -> Path:
    """Build (or reuse) a tiny Llama-architecture causal LM with its own BPE tokenizer.

    The model folder is ``out_dir/tiny-lm-<hash of the arguments>``; a second call with the
    same arguments returns it without rebuilding. Builds go to a temporary folder that is
    renamed into place, so concurrent builders never see half a model.

    Args:
        out_dir: Cache folder (created if missing).
        texts: Tokenizer training text (default: :func:`default_texts`).
        vocab_size: BPE vocabulary size, special tokens included (>= 300: the 256 byte
            symbols and a few merges).
        hidden_size: Model width (a multiple of 32; 4 attention heads, 2 key-value heads).
        num_layers: Decoder layers.
        chat_template: Save a Qwen2.5-style chat template with the tokenizer.
        seed: Seed of the weight initialisation.

    Returns:
        The model folder; load it with :func:`load_tiny_lm`.

    Raises:
        InvalidArgumentError: for out-of-range sizes or empty ``texts``.
        SearchGymError: when torch, transformers or tokenizers are missing.
    """
    vocab_size = check_int("vocab_size", vocab_size, 300)
    hidden_size = check_int("hidden_size", hidden_size, 32)
    if hidden_size % 32:
        raise InvalidArgumentError(f"hidden_size must be a multiple of 32, got {hidden_size}.")
    num_layers = check_int("num_layers", num_layers, 1)
    seed = check_int("seed", seed, 0)
    text_list = None if texts is None else [str(t) for t in texts]
    if text_list is not None and not any(t.strip() for t in text_list):
        raise InvalidArgumentError("texts is empty: give some text to train the tokenizer on, or None.")
    settings = {
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "num_layers": num_layers,
        "chat_template": bool(chat_template),
        "seed": seed,
    }
    target = Path(out_dir) / f"tiny-lm-{_cache_key(text_list, settings)}"

    def build(staging: Path) -> dict[str, Any]:
        _build(staging, text_list if text_list is not None else default_texts(), settings)
        return settings

    return build_once(target, _DONE, build)


def _imports() -> tuple[Any, Any, Any]:
    try:
        import tokenizers
        import torch
        import transformers
    except ImportError as exc:
        raise SearchGymError(
            f"The tiny LM needs torch, transformers and tokenizers ({exc}): pip install 'searchgym[train]' "
            "(on a CPU machine, pip install torch==2.13.0 first)."
        ) from exc
    return tokenizers, torch, transformers


def _build(folder: Path, texts: list[str], settings: dict[str, Any]) -> None:
    tokenizers, torch, transformers = _imports()
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE())
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=settings["vocab_size"],
        special_tokens=list(_SPECIAL_TOKENS),
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(texts, trainer)
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=TINY_CHAT_TEMPLATE if settings["chat_template"] else None,
        model_max_length=4096,
    )
    tokenizer.save_pretrained(folder)
    pad_id, eos_id = (tokenizer.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_end|>"))
    hidden = settings["hidden_size"]
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=settings["num_layers"],
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        initializer_range=0.1,
        bos_token_id=pad_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(settings["seed"])
        model = transformers.LlamaForCausalLM(config)
    model.generation_config = transformers.GenerationConfig(
        bos_token_id=pad_id, eos_token_id=eos_id, pad_token_id=pad_id
    )
    model.save_pretrained(folder)


def load_tokenizer(path: str | os.PathLike[str]) -> Any:
    """The tokenizer saved in ``path``: ``PreTrainedTokenizerFast`` when that is the class it
    was saved as (as :func:`build_tiny_lm` saves it), else ``AutoTokenizer``'s choice."""
    _, _, transformers = _imports()
    folder = Path(path)
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = {}
    try:
        if config.get("tokenizer_class") in ("PreTrainedTokenizerFast", "TokenizersBackend"):
            return transformers.PreTrainedTokenizerFast.from_pretrained(folder)
        return transformers.AutoTokenizer.from_pretrained(folder)
    except (OSError, ValueError) as exc:
        raise InvalidArgumentError(
            f"Cannot load a tokenizer from {str(path)!r} ({exc}). Pass a folder saved with "
            "save_pretrained (tokenizer.json, tokenizer_config.json)."
        ) from exc


def load_tiny_lm(path: str | os.PathLike[str]) -> tuple[Any, Any]:
    """``(model, tokenizer)`` from a folder written by :func:`build_tiny_lm` (model in eval mode)."""
    _, _, transformers = _imports()
    folder = Path(path)
    if not (folder / "config.json").is_file():
        raise InvalidArgumentError(
            f"{str(path)!r} holds no model (no config.json): pass the folder build_tiny_lm returned."
        )
    tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    return model.eval(), tokenizer
