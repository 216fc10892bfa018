"""vLLM's offline engine as a searchgym policy, for GPU machines (``--policy vllm:PATH``).

vLLM is imported when the policy is built, never at module import, so this module loads
anywhere; without vLLM the constructor raises a :class:`SearchGymError` that says how to
install it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..checks import check_int, check_number
from ..envs.protocols import Protocol, make_protocol
from ..error import InvalidArgumentError, SearchGymError
from .base import Policy
from .chat import ChatFormatter, ContextTracker, resolve_stop_strings

__all__ = ["VLLMPolicy", "import_vllm"]

INSTALL_HINT = (
    "pip install vllm on a Linux machine with an NVIDIA GPU (vLLM brings its own CUDA build of "
    "torch; see https://docs.vllm.ai/en/latest/getting_started/installation/). On a CPU machine "
    "use --policy hf:PATH instead, or serve the model elsewhere and use "
    "--policy openai:MODEL@http://host:port/v1."
)


def import_vllm() -> Any:
    """The ``vllm`` module.

    Raises:
        SearchGymError: when vLLM is not installed or fails to import (the message says how
            to install it and what to use instead).
    """
    try:
        import vllm
    except ImportError as exc:
        raise SearchGymError(
            f"The vllm policy needs vLLM, which cannot be imported ({exc}). {INSTALL_HINT}"
        ) from exc
    return vllm


class VLLMPolicy(Policy):
    """Generation with ``vllm.LLM``: the whole batch of contexts in one ``generate`` call.

    Contexts are split into turns and rendered with :class:`ChatFormatter` over vLLM's own
    tokenizer (the same text :class:`~searchgym.policies.hf.HFPolicy` and the trainers
    use), and passed as token ids, so no second BOS is added. Generation stops at the
    protocol's stop strings, which are kept in the output (``include_stop_str_in_output``),
    or at the end-of-sequence token.

    Args:
        model_path: A local model folder or a hub name.
        protocol: The env's protocol; it sets the stop strings.
        max_new_tokens: Tokens generated per action at most.
        temperature: 0 for greedy decoding, else the sampling temperature.
        top_p: Nucleus sampling threshold.
        seed: The engine's seed.
        stop_strings: Replace the protocol's stop strings.
        system: System message before the first user turn.
        observation_role: ``"user"`` or ``"tool"``.
        tensor_parallel_size: GPUs the model is split over.
        gpu_memory_utilization: Share of GPU memory vLLM may take.
        max_model_len: The context window (default: the model's).
        dtype: Weight dtype (``"auto"``, ``"bfloat16"``, ...).
        name: Policy name in result tables (default ``vllm:<path>``).
        **engine_kwargs: Passed to ``vllm.LLM`` as they are.

    Raises:
        SearchGymError: when vLLM is not installed.
    """

    def __init__(
        self,
        model_path: str,
        *,
        protocol: str | Protocol = "search_r1",
        max_new_tokens: int = 512,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int = 0,
        stop_strings: Sequence[str] | None = None,
        system: str | None = None,
        observation_role: str = "user",
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.9,
        max_model_len: int | None = None,
        dtype: str = "auto",
        name: str | None = None,
        **engine_kwargs: Any,
    ):
        if not isinstance(model_path, str) or not model_path:
            raise InvalidArgumentError(f"model_path must be a model folder or hub name, got {model_path!r}.")
        self.protocol = make_protocol(protocol)
        self.max_new_tokens = check_int("max_new_tokens", max_new_tokens, 1)
        self.temperature = check_number("temperature", temperature, 0)
        self.top_p = check_number("top_p", top_p, high=1, above=0)
        self.stop_strings = resolve_stop_strings(stop_strings, self.protocol)
        self.name = name or f"vllm:{model_path}"
        vllm = import_vllm()
        self._vllm = vllm
        self.llm = vllm.LLM(
            model=model_path,
            seed=check_int("seed", seed, 0),
            tensor_parallel_size=check_int("tensor_parallel_size", tensor_parallel_size, 1),
            gpu_memory_utilization=check_number(
                "gpu_memory_utilization", gpu_memory_utilization, high=1, above=0
            ),
            max_model_len=max_model_len,
            dtype=dtype,
            **engine_kwargs,
        )
        self.tokenizer = self.llm.get_tokenizer()
        self.formatter = ChatFormatter(self.tokenizer, system=system, observation_role=observation_role)
        self.tracker = ContextTracker()
        self.sampling_params = vllm.SamplingParams(
            n=1,
            temperature=self.temperature,
            top_p=self.top_p,
            max_tokens=self.max_new_tokens,
            stop=self.stop_strings,
            include_stop_str_in_output=True,
            skip_special_tokens=True,
        )

    def act(self, observations: Sequence[str]) -> list[str]:
        """One action per context, in order."""
        if isinstance(observations, str) or not all(isinstance(c, str) for c in observations):
            raise InvalidArgumentError(
                f"act expects a list of context strings, got {type(observations).__name__}."
            )
        if not observations:
            return []
        splits = [self.tracker.split(context) for context in observations]
        add_special = not self.formatter.uses_template
        prompts = [
            {
                "prompt_token_ids": list(
                    self.tokenizer(self.formatter.render(s), add_special_tokens=add_special)["input_ids"]
                )
            }
            for s in splits
        ]
        outputs = self.llm.generate(prompts, self.sampling_params, use_tqdm=False)
        if len(outputs) != len(prompts):
            raise SearchGymError(f"vLLM returned {len(outputs)} outputs for {len(prompts)} prompts.")
        actions = [output.outputs[0].text for output in outputs]
        for context, segments, action in zip(observations, splits, actions, strict=True):
            self.tracker.record(context, action, segments)
        return actions

    def __repr__(self) -> str:
        return f"VLLMPolicy({self.name!r}, protocol={self.protocol.name!r}, max_new_tokens={self.max_new_tokens})"
