"""verl 0.9.1's ``server_manager`` for an agent loop, on a CPU, over the vLLM-faithful engine.

An agent loop calls ``await server_manager.generate(request_id, prompt_ids=...,
sampling_params={...})``. In verl that is ``LLMServerClient.generate``
(``verl/workers/rollout/llm_server.py``) forwarding to ``vLLMHttpServer.generate``
(``verl/workers/rollout/vllm_rollout/vllm_async_server.py``), which does, in order:

- ``max_possible_tokens = max_model_len - len(prompt_ids)``; fewer than 1 raises ``ValueError``;
- ``max_tokens`` (or ``max_new_tokens``) popped from the dict, else
  ``min(response_length, prompt_length + response_length - len(prompt_ids))``; then clamped
  to ``[1, max_possible_tokens]``;
- ``logprobs`` becomes ``0`` when true, else ``None``; ``repetition_penalty`` and
  ``ignore_eos`` default to the rollout config's;
- ``SamplingParams(max_tokens=max_tokens, **sampling_params)``, every other key (``stop``,
  ``include_stop_str_in_output``, ``temperature`` ...) as the loop gave it; vLLM's own
  defaults for the rest (``skip_special_tokens=True``, ``min_tokens=0``);
- the answer: ``TokenOutput(token_ids=output.token_ids, log_probs=[logprobs[i][token_ids[i]]
  .logprob ...] or None, stop_reason="completed" for finish reasons stop and length,
  "aborted" for abort, extra_fields={"global_steps": ...})``. The text is dropped.

The engine behind it is :class:`fake_vllm.FakeVLLMEngine`, which applies vLLM 0.29's stop
rules to the tokens a generator picks.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from fake_vllm import FakeVLLMEngine, SamplingParams
from verl.workers.rollout.replica import TokenOutput

__all__ = ["VerlSamplingParams", "VerlServerManager"]


@dataclass
class VerlSamplingParams(SamplingParams):
    """The fake engine's ``SamplingParams`` with the keys verl's server always sets."""

    repetition_penalty: float = 1.0


class VerlServerManager:
    """``server_manager.generate`` as verl's vLLM server answers it; see the module docstring.

    Args:
        engine: The vLLM-faithful engine.
        prompt_length: ``rollout.prompt_length``.
        response_length: ``rollout.response_length``.
        max_model_len: ``rollout.max_model_len`` (verl's default: prompt + response length).
    """

    def __init__(
        self,
        engine: FakeVLLMEngine,
        prompt_length: int,
        response_length: int,
        max_model_len: int | None = None,
    ):
        self.engine = engine
        self.prompt_length, self.response_length = prompt_length, response_length
        self.max_model_len = max_model_len or prompt_length + response_length
        self.calls: list[dict[str, Any]] = []
        """Every request: its prompt ids and the sampling params the loop passed."""

    async def generate(
        self,
        request_id: str,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: Any = None,
        video_data: Any = None,
        audio_data: Any = None,
        mm_processor_kwargs: Any = None,
        **kwargs: Any,
    ) -> TokenOutput:
        prompt_ids = [int(t) for t in prompt_ids]
        self.calls.append({"prompt_ids": prompt_ids, "sampling_params": copy.deepcopy(sampling_params)})
        params = dict(sampling_params)
        max_possible = self.max_model_len - len(prompt_ids)
        if max_possible < 1:
            raise ValueError(
                f"Prompt length ({len(prompt_ids)}) leaves no room to generate within the "
                f"model's maximum context length ({self.max_model_len})"
            )
        if "max_tokens" in params:
            max_tokens = params.pop("max_tokens")
        elif "max_new_tokens" in params:
            max_tokens = params.pop("max_new_tokens")
        else:
            max_tokens = min(
                self.response_length, self.prompt_length + self.response_length - len(prompt_ids)
            )
        max_tokens = max(1, min(max_tokens, max_possible))
        params["logprobs"] = 0 if params.pop("logprobs", False) else None
        params.setdefault("repetition_penalty", 1.0)
        params.setdefault("ignore_eos", False)
        vllm_params = VerlSamplingParams(max_tokens=max_tokens, **params)
        result = await self.engine.generate(prompt_ids, vllm_params)
        out = result.outputs[0]
        log_probs = None
        if vllm_params.logprobs is not None:
            log_probs = [entry[out.token_ids[i]].logprob for i, entry in enumerate(out.logprobs)]
        reason = out.finish_reason
        stop_reason = (
            "aborted" if reason == "abort" else "completed" if reason in ("stop", "length") else reason
        )
        return TokenOutput(
            token_ids=list(out.token_ids),
            log_probs=log_probs,
            stop_reason=stop_reason,
            extra_fields={"global_steps": 0},
        )
