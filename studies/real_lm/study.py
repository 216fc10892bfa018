"""The real-LM study: every scheme on SmolLM2 with BM25, the built-in GRPO trainer, 3 seeds.

    searchgym study --config studies/real_lm/study.yaml --output-dir DIR [--arms ...] [--seeds ...]

Steps, each cached in ``DIR`` and skipped when its file exists with the same settings:

1. ``data/``: the PopQA split (RL-training and held-out questions, taught facts) and the
   short-passage corpus (:mod:`real_lm.data`).
2. ``warm_<key>/``: the shared warm start (:mod:`real_lm.warm_start`).
3. ``baselines.json``: the known/unknown probe of every held-out question on the
   warm-started model, and the baselines on the same questions.
4. ``cells/<arm>/seed<s>/cell.json``: one GRPO run per arm and seed for its full budget,
   evaluated greedily and at the training temperature, with per-question outputs.

Then ``DIR/results.json`` (every cell, means with 95% intervals over seeds, paired
differences against ``f1``, the baselines, the split and the settings).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import statistics
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

from searchgym.envs.config_base import merge, read_yaml
from searchgym.error import DataFileError, InvalidArgumentError, did_you_mean

from .data import DataSettings, StudyData, answer_prior, prepare_data
from .evaluation import (
    FIGURES,
    answer_prompts,
    figures,
    heuristic_answers,
    interval,
    no_search_answers,
    probe_known,
    run_episodes,
    score_answers,
)
from .warm_start import WarmStartSettings, warm_start

__all__ = ["load_study", "run_study", "run_cell", "aggregate", "cell_config"]

logger = logging.getLogger("searchgym.trainers")

KEYS = {
    "runner",
    "output_dir",
    "seeds",
    "model",
    "threads",
    "workers",
    "keep_checkpoints",
    "data",
    "warm_start",
    "instructions",
    "eval",
    "base",
    "arms",
}


def load_study(path: str | Path) -> dict[str, Any]:
    """Read a study file; unknown keys and arms that are not mappings fail here."""
    try:
        study = read_yaml(path)  # the library's one YAML reader: a study file may use extends
    except DataFileError as exc:
        raise InvalidArgumentError(f"Cannot read the study file {str(path)!r}: {exc}") from None
    if not isinstance(study, dict) or not isinstance(study.get("arms"), dict) or not study["arms"]:
        raise InvalidArgumentError(f"{path}: a study file needs an 'arms' mapping of arm -> changes.")
    unknown = sorted(set(study) - KEYS)
    if unknown:
        raise InvalidArgumentError(f"{path}: unknown key {unknown[0]!r}; expected one of {sorted(KEYS)}.")
    study.setdefault("output_dir", "runs/real_lm")
    study.setdefault("seeds", [0, 1, 2])
    if not isinstance(study.setdefault("keep_checkpoints", False), bool):
        raise InvalidArgumentError(
            f"{path}: keep_checkpoints: got {study['keep_checkpoints']!r}; expected true or false."
        )
    study["data"] = DataSettings(**(study.get("data") or {}))
    ws = dict(study.get("warm_start") or {})
    for name in ("protocols", "lesson_prompts"):
        if name in ws:
            ws[name] = tuple(ws[name])
    study["warm_start"] = WarmStartSettings(**ws)
    for name in study["arms"]:
        cell_config(study, name, 0, Path("."), None)  # fails now on a bad arm
    return study


def _env_kwargs(study: Mapping[str, Any], data: StudyData | None, protocol: str) -> dict[str, Any]:
    """The PopQA env's arguments shared by every use (training, demos, evaluation)."""
    kwargs = dict(study["base"]["env"]["kwargs"])
    kwargs["protocol"] = protocol
    kwargs["instructions"] = study["instructions"][protocol]
    if data is not None:
        kwargs["corpus_path"] = str(data.corpus_path)
        kwargs["index_dir"] = str(data.folder / "bm25")
        kwargs["data_path"] = str(data.train_path)
    return kwargs


def cell_config(study: Mapping[str, Any], arm: str, seed: int, out: Path, data: StudyData | None, model=None):
    """The :class:`~searchgym.trainers.config.TrainConfig` of ``arm`` and ``seed``."""
    from searchgym.trainers.config import TrainConfig

    if arm not in study["arms"]:
        raise did_you_mean("arm", arm, study["arms"])
    config = merge(study["base"], study["arms"][arm] or {})
    protocol = config["env"]["kwargs"].get("protocol", "search_r1")
    config["env"]["kwargs"] = {**_env_kwargs(study, data, protocol), **config["env"]["kwargs"]}
    config["env"]["kwargs"]["instructions"] = study["instructions"][protocol]
    config["seed"] = seed
    config["output_dir"] = str(out / "cells" / arm / f"seed{seed}")
    config.setdefault("model", {})["path"] = str(model) if model else study.get("model")
    return TrainConfig.from_dict(config)


def cell_order(study: Mapping[str, Any], arms: Sequence[str], seeds: Sequence[int]) -> list[tuple[str, int]]:
    """The cells to run, those with the longest rollout contexts (the slowest) first, so that
    no worker is left alone with a slow cell at the end."""

    tokens = {arm: cell_config(study, arm, 0, Path("."), None).rollout.max_context_tokens for arm in arms}
    return sorted(((a, s) for s in seeds for a in arms), key=lambda cell: -tokens[cell[0]])


def _key(out: Path, *parts: Any) -> str:
    """A hash of ``parts`` with paths under the output folder ``out`` made relative to it, so a
    moved output folder keeps its finished parts."""
    blob = json.dumps(parts, sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha256(blob.replace(f'"{out}/', '"<out>/').encode()).hexdigest()[:16]


def _load(path: Path, key: str) -> dict[str, Any] | None:
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return found if found.get("key") == key else None


def _write(path: Path, data: Mapping[str, Any]) -> None:
    from searchgym.storage import write_atomically

    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(_no_nan(data), indent=1, allow_nan=False) + "\n"
    write_atomically(path, text.encode("utf-8"))


def _no_nan(value: Any) -> Any:
    """``value`` with every NaN (a share of an empty subset) written as None (JSON null)."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, Mapping):
        return {k: _no_nan(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_no_nan(v) for v in value]
    return value


def _eval_settings(study: Mapping[str, Any]) -> dict[str, Any]:
    rollout = study["base"].get("rollout", {})
    return {
        "temperature": float(study.get("eval", {}).get("temperature", rollout.get("temperature", 1.0))),
        "max_new_tokens": int(rollout.get("max_new_tokens", 32)),
        "max_context_tokens": int(rollout.get("max_context_tokens", 1024)),
        "batch_size": int(study.get("eval", {}).get("batch_size", 32)),
        "max_questions": study.get("eval", {}).get("max_questions"),
    }


def _heldout_env(config: Any, data: StudyData, memory: Any = None):
    """A factory of held-out envs of the cell (F1 reward, its protocol; its memory, read only)."""
    from searchgym.trainers.config import EnvConfig
    from searchgym.trainers.grpo.envs import env_factory

    kwargs = {**config.env.kwargs, "data_path": str(data.heldout_path), "reward": "f1"}
    kwargs.pop("reward_kwargs", None)
    make = env_factory(EnvConfig(id=config.env.id, kwargs=kwargs), None, memory, config.memory)
    if memory is None:
        return make

    def make_read_only():
        env = make()
        env.record = False
        return env

    return make_read_only


def _evaluate(model: Any, tokenizer: Any, make_env, study: Mapping[str, Any], count: int, seed: int) -> dict:
    ev = _eval_settings(study)
    out: dict[str, Any] = {}
    for mode, temperature in (("greedy", 0.0), ("sampled", ev["temperature"])):
        start = time.perf_counter()
        out[mode] = run_episodes(
            make_env,
            model,
            tokenizer,
            count=count,
            temperature=temperature,
            seed=seed,
            max_new_tokens=ev["max_new_tokens"],
            max_context_tokens=ev["max_context_tokens"],
            batch_size=ev["batch_size"],
        )
        out[f"{mode}_s"] = round(time.perf_counter() - start, 1)
    return out


def study_warm_start(
    study: Mapping[str, Any], out: Path, data: StudyData, *, log: Any = print, reuse_only: bool = False
) -> tuple[Path, dict[str, Any]]:
    """The study's warm start in ``out`` (trained unless ``reuse_only``): the folder the cells
    start from (the decision pass's, when there is one) and its figures."""
    return warm_start(
        data,
        study["warm_start"],
        model=study["model"],
        env_kwargs={p: _env_kwargs(study, data, p) for p in (*study["warm_start"].protocols, "search_r1")},
        folder=out,
        threads=int(study.get("threads", 1)),
        log=log,
        reuse_only=reuse_only,
    )


def run_baselines(
    study: Mapping[str, Any], out: Path, data: StudyData, model_dir: Path, reuse_only: bool = False
) -> dict[str, Any]:
    """The known/unknown probe and every baseline on the held-out questions (cached; with
    ``reuse_only``, missing ones are an error)."""
    import torch
    from transformers import AutoModelForCausalLM

    from searchgym.models import resolve_model
    from searchgym.policies.tiny import load_tokenizer

    key = _key(out, str(model_dir), study["model"], _eval_settings(study), study["instructions"], "v2")
    path = out / "baselines.json"
    found = _load(path, key)
    if found is not None:
        return found
    if reuse_only:
        raise InvalidArgumentError(
            f"{str(path)!r} holds no baselines for this warm start; run the study without --collect."
        )
    torch.set_num_threads(int(study.get("threads", 1)))
    start = time.perf_counter()
    heldout = _limit(data.heldout, study)
    kwargs = _env_kwargs(study, data, "search_r1")
    tokenizer = load_tokenizer(model_dir)
    warm = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    probe = probe_known(warm, tokenizer, kwargs, heldout, str(data.heldout_path))
    known = {p["qid"]: p["known"] for p in probe}
    config = cell_config(study, "f1", 0, out, data, model_dir)
    make_env = _heldout_env(config, data)
    passages = _top1(kwargs, heldout)
    rows: dict[str, Any] = {}
    rows["no_retrieval"] = score_answers(heldout, no_search_answers(warm, tokenizer, heldout), 0)
    rows["naive_rag"] = score_answers(heldout, no_search_answers(warm, tokenizer, heldout, passages), 1)
    prior = answer_prior(data.train)
    rows["answer_prior"] = score_answers(heldout, [prior.get(q["metadata"]["prop"], "") for q in heldout], 0)
    rows["heuristic"] = score_answers(heldout, heuristic_answers(data, heldout, passages), 1)
    episodes = _evaluate(warm, tokenizer, make_env, study, len(heldout), 0)
    rows["warm_started"], rows["warm_started_sampled"] = episodes["greedy"], episodes["sampled"]
    untrained_dir = resolve_model(study["model"])
    untrained = AutoModelForCausalLM.from_pretrained(untrained_dir, dtype=torch.float32).eval()
    untrained_tok = load_tokenizer(untrained_dir)
    rows["untrained"] = _evaluate(untrained, untrained_tok, make_env, study, len(heldout), 0)["greedy"]
    result = {
        "key": key,
        "probe": probe,
        "known_pct": 100.0 * sum(known.values()) / len(known),
        "known_taught_pct": _share(probe, data, True),
        "known_untaught_pct": _share(probe, data, False),
        "rows": {name: {"figures": figures(r, known), "questions": r} for name, r in rows.items()},
        "wall_s": round(time.perf_counter() - start, 1),
    }
    _write(path, result)
    return result


def run_first_action(
    study: Mapping[str, Any], out: Path, data: StudyData, model_dir: Path, known: Mapping[str, bool]
) -> dict[str, Any]:
    """The warm start's ``p(search)`` of the first action on each held-out question (cached)."""
    import torch
    from transformers import AutoModelForCausalLM

    from searchgym.policies.tiny import load_tokenizer

    from .first_action import greedy_recalls, opening_probabilities, summarise

    key = _key(
        out, str(model_dir), _eval_settings(study)["max_questions"], study["instructions"]["search_r1"], "v2"
    )
    path = out / "first_action.json"
    found = _load(path, key)
    if found is not None:
        return found
    torch.set_num_threads(int(study.get("threads", 1)))
    heldout = _limit(data.heldout, study)
    tokenizer = load_tokenizer(model_dir)
    env_kwargs = _env_kwargs(study, data, "search_r1")
    prompts = answer_prompts(tokenizer, env_kwargs, str(data.heldout_path), len(heldout))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    prompts = [p.removesuffix("<answer>") for p in prompts]
    recalls = greedy_recalls(model, tokenizer, prompts) if study["warm_start"].recall_first else None
    if recalls is not None:
        prompts = [f"{p}<think>{r}</think>" for p, r in zip(prompts, recalls, strict=True)]
    rows = [
        {
            "qid": q["id"],
            "known": known[q["id"]],
            "taught": q["id"] in data.taught,
            "p_search": round(search / (search + answer), 5),
            "p_action": float(f"{search + answer:.4g}"),  # significant digits: it may be tiny
        }
        for q, (search, answer) in zip(heldout, opening_probabilities(model, tokenizer, prompts), strict=True)
    ]
    for row, recall in zip(rows, recalls or [], strict=False):
        row["recall"] = recall.strip()
    result = {"key": key, "groups": summarise(rows), "questions": rows}
    _write(path, result)
    return result


def _share(probe: list[dict[str, Any]], data: StudyData, taught: bool) -> float:
    side = [p for p in probe if (p["qid"] in data.taught) == taught]
    return 100.0 * sum(p["known"] for p in side) / len(side) if side else math.nan


def _limit(questions: list[dict[str, Any]], study: Mapping[str, Any]) -> list[dict[str, Any]]:
    count = _eval_settings(study)["max_questions"]
    return questions[:count] if count else questions


def _top1(kwargs: Mapping[str, Any], questions: Sequence[dict[str, Any]]) -> list[str]:
    """The BM25 top-1 passage (title and text) of each question, from the env's retriever."""
    import gymnasium as gym

    env = gym.make("searchgym/PopQA-v1", **kwargs)
    popqa: Any = env.unwrapped
    docs = popqa.retriever.search([q["question"] for q in questions], 1)
    env.close()
    return [f"{d[0].title}: {d[0].text}" if d else "" for d in docs]


def run_cell(study: Mapping[str, Any], arm: str, seed: int, out_dir: str, model_dir: str) -> dict[str, Any]:
    """Train ``arm`` for ``seed`` from the warm start for its full budget; evaluate; write ``cell.json``."""
    import torch

    from searchgym.trainers.grpo.trainer import GRPOTrainer

    out, data = Path(out_dir), prepare_data(study["data"], Path(out_dir) / "data")
    config = cell_config(study, arm, seed, out, data, model_dir)
    key = _key(out, asdict(config), _eval_settings(study), "v2")
    path = Path(config.output_dir) / "cell.json"
    found = _load(path, key)
    if found is not None:
        return found
    torch.set_num_threads(int(study.get("threads", 1)))
    start, cpu_start = time.perf_counter(), time.process_time()
    trainer = GRPOTrainer(config, progress=False)
    try:
        state = trainer.train()
        train_s, train_cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
        heldout = _limit(data.heldout, study)
        make_env = _heldout_env(config, data, trainer.memory)
        episodes = _evaluate(trainer.model, trainer.tokenizer, make_env, study, len(heldout), seed)
    finally:
        trainer.close()
    steps = [r["train"]["step_s"] for r in state.history]
    result = {
        "key": key,
        "arm": arm,
        "seed": seed,
        "steps": state.step,
        "train_s": round(train_s, 1),
        "median_step_s": round(statistics.median(steps), 2) if steps else None,
        "eval_s": {"greedy": episodes["greedy_s"], "sampled": episodes["sampled_s"]},
        "wall_s": round(time.perf_counter() - start, 1),
        "train_cpu_s": round(train_cpu_s, 1),
        "cpu_s": round(time.process_time() - cpu_start, 1),
        "torch_threads": torch.get_num_threads(),
        "greedy": episodes["greedy"],
        "sampled": episodes["sampled"],
    }
    _write(path, result)
    if not study.get("keep_checkpoints", False):
        # the cell's figures are written: its resume point (about 0.8 GB for SmolLM2) is not needed
        shutil.rmtree(Path(config.output_dir) / "checkpoints", ignore_errors=True)
    return result


def run_study(
    study: Mapping[str, Any],
    output_dir: str | Path | None = None,
    *,
    arms: Sequence[str] | None = None,
    seeds: Sequence[int] | None = None,
    log: Any = print,
    collect: bool = False,
) -> dict[str, Any]:
    """Run (or pick up) the study's cells; write and return ``results.json``'s content.

    With ``collect``, nothing trains: the table holds the cells already finished, and a warm
    start or baselines not finished for these settings are an error.
    """
    for arm in arms or ():
        if arm not in study["arms"]:
            raise did_you_mean("arm", arm, study["arms"])
    out = Path(output_dir or study["output_dir"])
    start = time.perf_counter()
    data = prepare_data(study["data"], out / "data")
    model_dir, warm = study_warm_start(study, out, data, log=log, reuse_only=collect)
    decision_s = warm.get("decision", {}).get("wall_s", 0.0)
    log(f"warm start: {model_dir} ({warm['wall_s']} s, decision pass {decision_s} s)")
    baselines = run_baselines(study, out, data, model_dir, reuse_only=collect)
    log(f"known held-out questions: {baselines['known_pct']:.0f}%")
    known = {p["qid"]: p["known"] for p in baselines["probe"]}
    first = run_first_action(study, out, data, model_dir, known)
    log(
        f"p(search) of the first action, median: {first['groups']['known'].get('median')} on known, "
        f"{first['groups']['unknown'].get('median')} on unknown questions"
    )
    todo = [] if collect else cell_order(study, arms or list(study["arms"]), seeds or study["seeds"])
    workers = max(1, int(study.get("workers", 1)))
    cells: list[dict[str, Any]] = []
    if workers == 1 or not todo:
        for arm, seed in todo:
            log(f"cell {arm}, seed {seed}")
            cells.append(run_cell(study, arm, seed, str(out), str(model_dir)))
    else:
        import multiprocessing

        # spawned workers start with this process's sys.path, so they import this module by name
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(workers, mp_context=context, initializer=die_with_parent) as pool:
            futures = [pool.submit(run_cell, dict(study), a, s, str(out), str(model_dir)) for a, s in todo]
            for (arm, seed), future in zip(todo, futures, strict=True):
                cells.append(future.result())
                log(f"cell {arm}, seed {seed}: {cells[-1]['wall_s']} s")
    done = _collect(study, out, data, model_dir, cells)
    results = {
        "arms": aggregate(done, known),
        "baselines": {name: row["figures"] for name, row in baselines["rows"].items()},
        "known": {
            "pct": baselines["known_pct"],
            "taught_pct": baselines["known_taught_pct"],
            "untaught_pct": baselines["known_untaught_pct"],
            "probe": baselines["probe"],
        },
        "split": data.summary(),
        "warm_start": warm,
        "first_action": {"groups": first["groups"], "questions": first["questions"]},
        "settings": _settings(study),
        "timing": {
            "wall_s": round(time.perf_counter() - start, 1),
            "workers": workers,
            "baselines_s": baselines.get("wall_s"),
        },
        "baseline_questions": {name: row["questions"] for name, row in baselines["rows"].items()},
    }
    _write(out / "results.json", results)
    return results


def die_with_parent() -> None:
    """Ask Linux to end this worker when the study's process ends, however it ends: a killed
    study must not leave a cell training on into a folder that its rerun also writes."""
    import ctypes
    import signal
    import sys

    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG


def _collect(study, out: Path, data: StudyData, model_dir: Path, fresh: list[dict[str, Any]]) -> list[dict]:
    """Every finished cell of the study's arms and seeds (not only those run now)."""
    cells = {(c["arm"], c["seed"]): c for c in fresh}
    for arm in study["arms"]:
        for seed in study["seeds"]:
            if (arm, seed) in cells:
                continue
            config = cell_config(study, arm, seed, out, data, model_dir)
            found = _load(
                Path(config.output_dir) / "cell.json", _key(out, asdict(config), _eval_settings(study), "v2")
            )
            if found is not None:
                cells[(arm, seed)] = found
    for (arm, seed), cell in cells.items():
        cell.setdefault("rollouts", _rollout_curve(out / "cells" / arm / f"seed{seed}"))
    return [cells[k] for k in sorted(cells, key=lambda k: (list(study["arms"]).index(k[0]), k[1]))]


def _rollout_curve(run_dir: Path) -> list[dict[str, float]]:
    """Per training step: the share of sampled rollouts that searched, their EM and reward."""
    from searchgym.trainers.grpo.metrics_file import read_metrics

    try:
        rows = read_metrics(run_dir)
    except DataFileError:
        return []
    return [
        {"step": r["step"], **{k: round(r[f"rollout/{k}"], 4) for k in ("sr", "em", "reward")}}
        for r in rows
        if "rollout/sr" in r
    ]


def _settings(study: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "model": study["model"],
        "seeds": list(study["seeds"]),
        "threads": study.get("threads", 1),
        "workers": study.get("workers", 1),
        "data": asdict(study["data"]),
        "warm_start": asdict(study["warm_start"]),
        "instructions": study["instructions"],
        "eval": _eval_settings(study),
        "base": study["base"],
        "arms": study["arms"],
    }


def _mean_block(rows: list[dict[str, float]]) -> dict[str, Any]:
    block: dict[str, Any] = {}
    for name in FIGURES:
        values = [r[name] for r in rows if not math.isnan(r[name])]
        block[name] = round(statistics.fmean(values), 4) if values else math.nan
    block["ci95"] = {name: round(interval([r[name] for r in rows]), 4) for name in FIGURES}
    return block


def aggregate(cells: list[dict[str, Any]], known: dict[str, bool]) -> dict[str, Any]:
    """Per arm: ``mean`` (greedy figures, their ``ci95`` and a ``sampled`` block), ``seeds``
    (figures and per-question outputs of each seed) and ``vs_f1`` (paired differences)."""
    by_arm: dict[str, list[dict[str, Any]]] = {}
    for cell in cells:
        by_arm.setdefault(cell["arm"], []).append(cell)
    out: dict[str, Any] = {}
    for arm, runs in by_arm.items():
        seeds = []
        for cell in runs:
            greedy, sampled = figures(cell["greedy"], known), figures(cell["sampled"], known)
            questions = [
                {**q, "known": bool(known.get(q["qid"])), "sampled": _pick(s)}
                for q, s in zip(cell["greedy"], cell["sampled"], strict=True)
            ]
            seeds.append(
                {
                    "seed": cell["seed"],
                    **{k: round(v, 4) for k, v in greedy.items()},
                    "sampled": {k: round(v, 4) for k, v in sampled.items()},
                    "steps": cell["steps"],
                    "train_s": cell["train_s"],
                    "wall_s": cell["wall_s"],
                    "median_step_s": cell["median_step_s"],
                    "cpu_s": cell.get("cpu_s"),
                    "train_cpu_s": cell.get("train_cpu_s"),
                    "rollouts": cell.get("rollouts", []),
                    "questions": questions,
                }
            )
        mean = _mean_block(seeds)
        mean["sampled"] = _mean_block([s["sampled"] for s in seeds])
        out[arm] = {"mean": mean, "seeds": seeds}
    if "f1" in out:
        base = {s["seed"]: s for s in out["f1"]["seeds"]}
        for entry in out.values():
            diffs = {}
            for name in ("em", "st", "sr_known", "sr_unknown"):
                pairs = [s[name] - base[s["seed"]][name] for s in entry["seeds"] if s["seed"] in base]
                pairs = [p for p in pairs if not math.isnan(p)]
                diffs[name] = {
                    "mean": round(statistics.fmean(pairs), 4) if pairs else math.nan,
                    "ci95": round(interval(pairs), 4),
                    "n": len(pairs),
                }
            entry["vs_f1"] = diffs
    return out


def _pick(record: Mapping[str, Any]) -> dict[str, Any]:
    return {k: record[k] for k in ("searches", "answer", "em", "f1", "format_ok")}


def configure_threads(threads: int) -> None:
    """Pin the BLAS/OpenMP thread count before torch loads (one thread per cell)."""
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(name, str(threads))
