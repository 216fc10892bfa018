"""One run of the study: warm start (when ``sft.enabled``), GRPO, evaluation (when ``eval.enabled``)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchgym.policies.evaluation import EvalResult
from searchgym.storage import write_atomically
from searchgym.trainers.grpo.checkpoint import TrainerState
from searchgym.trainers.grpo.ptx import write_ptx_examples
from searchgym.trainers.grpo.trainer import GRPOTrainer

from .config import StudyRunConfig

__all__ = ["PipelineResult", "run_pipeline"]

logger = logging.getLogger("searchgym.trainers")


@dataclass
class PipelineResult:
    """What :func:`run_pipeline` produced.

    Attributes:
        state: The GRPO trainer's final state.
        start_model: The folder GRPO started from (the warm start, or ``model.path``).
        evaluation: The held-out evaluation (None when ``eval.enabled`` is off).
    """

    state: TrainerState
    start_model: Path | None
    evaluation: EvalResult | None


def run_pipeline(config: StudyRunConfig, *, progress: bool = True, name: str | None = None) -> PipelineResult:
    """Warm-start, train and evaluate as ``config`` says; writes ``{output_dir}/eval.json``.

    With ``sft.enabled``, GRPO starts from the cached warm start of
    :func:`~tiny_lm.warm_start.warm_start` instead of ``model``'s own weights
    (the tokenizer comes with it). The run's ``config.yaml`` names that folder, with
    ``sft.enabled`` off, so training it again with more ``steps`` resumes the run. The
    evaluation runs on the trained model with the env of ``eval.env_kwargs`` and, for runs
    with experience memory, the memory's final state.
    """
    start_model: Path | None = None
    if config.sft.enabled:
        from .warm_start import warm_start

        start_model = warm_start(config, progress=progress)
        logger.info("Warm start: %s", start_model)
        algo = vars(config.algo)
        if config.algo.ptx_coef > 0 and config.algo.ptx_data is None:
            algo = {**algo, "ptx_data": str(_write_recall_replay(config))}
        config = config.replace(
            model={**vars(config.model), "path": str(start_model), "tiny": None},
            sft={**vars(config.sft), "enabled": False},
            algo=algo,
        )
    trainer = GRPOTrainer(config, progress=progress)
    try:
        state = trainer.train()
        evaluation = None
        if config.eval.enabled:
            from .evaluation import evaluate_model

            evaluation = evaluate_model(
                trainer.model,
                trainer.tokenizer,
                config,
                name=name or Path(config.output_dir).name,
                memory=trainer.memory,
            )
            write_json(Path(config.output_dir) / "eval.json", evaluation.to_dict())
    finally:
        trainer.close()
    return PipelineResult(state, start_model, evaluation)


def _write_recall_replay(config: StudyRunConfig) -> Path:
    """Write the warm start's recall lessons, each once, as the run's ptx data; returns the file."""
    from .demos import demo_env, recall_pairs

    kwargs = config.env.kwargs
    world = demo_env(int(kwargs.get("world_seed", 0)), kwargs, split="train").world
    path = Path(config.output_dir) / "ptx_recall.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    count = write_ptx_examples(path, recall_pairs(world))
    logger.info("Replaying %d recall lessons (ptx_coef %g) from %s", count, config.algo.ptx_coef, path)
    return path


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` as JSON with :func:`~searchgym.storage.write_atomically`."""
    write_atomically(path, (json.dumps(data, indent=2) + "\n").encode("utf-8"))
