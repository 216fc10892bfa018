"""``searchgym study``: every arm of the CPU study, for several seeds, in one table and one plot.

A study file holds a ``base`` run (a :class:`~searchgym.trainers.config.StudyRunConfig` as a
mapping, with ``sft`` and ``eval`` on) and ``arms``: each arm is a mapping of changes merged
into the base (nested mappings merge key by key; anything else replaces). Every arm runs
once per seed with ``seed`` set, in ``{output_dir}/{arm}/seed{seed}``; all arms of a seed
share its warm start (the SFT cache). A run whose ``eval.json`` exists and was written
with the same settings (a hash of the run's config, stored in it) is not run again, so an
interrupted study picks up where it stopped; after a change to the study file the changed
arms run again. Code changes are not seen: delete ``output_dir`` after one.

Outputs in ``output_dir``: ``results.json`` (every run, and mean and std per arm),
``results.md`` (the table, mean ± std over seeds; "Recall" and "Copy" are the skills of
:func:`~tiny_lm.evaluation.forced_skills` after RL) and ``frontier.png`` (EM against mean
searches per question, per arm, with std error bars: the papers' trade-off plot).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from searchgym.envs.config_base import merge, read_yaml, to_dict
from searchgym.error import DataFileError, InvalidArgumentError, did_you_mean
from searchgym.trainers.config import ConfigError

from .config import StudyRunConfig

__all__ = ["load_study", "arm_config", "run_study", "aggregate", "format_results", "plot_frontier", "merge"]

logger = logging.getLogger("searchgym.trainers")

COLUMNS = (
    ("EM", ("em",), 100),
    ("F1", ("f1",), 100),
    ("ST", ("st",), 1),
    ("SD", ("sd",), 1),
    ("SR", ("sr",), 100),
    ("SR known", ("splits", "known", "sr"), 100),
    ("SR unknown", ("splits", "unknown", "sr"), 100),
    ("SR known recalled", ("settings", "skills", "sr_known_recalled"), 100),
    ("EM known", ("splits", "known", "em"), 100),
    ("EM unknown", ("splits", "unknown", "em"), 100),
    ("EM 2-hop", ("splits", "2-hop", "em"), 100),
    ("Recall", ("settings", "skills", "forced_recall"), 100),
    ("Chain recall", ("settings", "skills", "forced_chain"), 100),
    ("Copy", ("settings", "skills", "forced_copy"), 100),
    ("P(search) recalled", ("settings", "skills", "p_search_right"), 100),
    ("P(search) 'unknown'", ("settings", "skills", "p_search_said_unknown"), 100),
    ("Tokens", ("settings", "action_tokens"), 1),
    ("Eval s", ("wall_time_s",), 1),
)
"""``(heading, path into an eval result, scale)`` of each table column."""


def load_study(path: str | Path) -> dict[str, Any]:
    """Read a study file and check every arm's config (raises :class:`ConfigError`)."""
    try:
        data = read_yaml(path)  # the library's one YAML reader: a study file may use extends
    except DataFileError as exc:
        raise InvalidArgumentError(f"Cannot read the study file {str(path)!r}: {exc}") from exc
    if not isinstance(data, Mapping):
        raise InvalidArgumentError(f"{path}: expected a mapping with output_dir, seeds, base and arms.")
    unknown = set(data) - {"runner", "output_dir", "seeds", "base", "arms"}
    if unknown:
        raise ConfigError(
            sorted(unknown)[0],
            data[sorted(unknown)[0]],
            "runner, output_dir, seeds, base or arms",
            source=str(path),
        )
    seeds, arms = data.get("seeds", [0]), data.get("arms")
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and s >= 0 for s in seeds):
        raise ConfigError("seeds", seeds, "a non-empty list of ints >= 0", source=str(path))
    if not isinstance(arms, Mapping) or not arms:
        raise ConfigError("arms", arms, "a mapping of arm name -> config changes", source=str(path))
    base = data.get("base") or {}
    for name, changes in arms.items():
        if not isinstance(changes, Mapping):
            raise ConfigError(f"arms.{name}", changes, "a mapping of config changes", source=str(path))
        try:
            StudyRunConfig.from_dict(merge(base, changes))
        except ConfigError as exc:
            raise exc.within(f"arms.{name}", str(path)) from None
    return {
        "output_dir": str(data.get("output_dir", "runs/study")),
        "seeds": seeds,
        "base": base,
        "arms": dict(arms),
    }


def arm_config(study: Mapping[str, Any], arm: str, seed: int) -> StudyRunConfig:
    """The run config of ``arm`` and ``seed`` in ``study`` (a :func:`load_study` result)."""
    data = merge(study["base"], study["arms"][arm])
    data["seed"] = seed
    data["output_dir"] = str(Path(study["output_dir"]) / arm / f"seed{seed}")
    wandb = data.setdefault("wandb", {})
    if wandb.get("enabled"):
        wandb.setdefault("name", f"{arm}-seed{seed}")
        wandb["tags"] = list(wandb.get("tags", [])) + [arm, "study"]
    return StudyRunConfig.from_dict(data)


def config_key(config: StudyRunConfig, *, with_output_dir: bool = False) -> str:
    """A hash of a run's settings, stored in its ``eval.json``.

    Only the fields that differ from their defaults are hashed, so a field added to the
    config later (at a default that keeps the old behaviour) does not make every finished
    run stale. A changed *default* is therefore not seen either: delete ``output_dir``
    after such a change. ``output_dir`` is where a run is, not how it runs, and is left
    out, so a study whose folder is moved or renamed keeps its finished runs; keys written
    before that hashed it too (``with_output_dir``), and :func:`run_study` still accepts
    them where the run has not moved.
    """
    changed = _non_defaults(config)
    if not with_output_dir:
        changed.pop("output_dir", None)
    return hashlib.sha256(json.dumps(changed, sort_keys=True, default=str).encode()).hexdigest()[:16]


def run_key(config: StudyRunConfig, *, with_output_dir: bool = False) -> str:
    """:func:`config_key`, and with ``sft.enabled`` the warm start's folder name too: a run
    stays finished only while the code would build it the same warm start (a change to how
    warm starts are written moves their hash, e.g. ``sft_key``'s version)."""
    key = config_key(config, with_output_dir=with_output_dir)
    if not config.sft.enabled:
        return key
    from .warm_start import warm_start_folder

    return f"{key}+{warm_start_folder(config).name}"


def _non_defaults(section: Any) -> dict[str, Any]:
    """The fields of a config dataclass that differ from their defaults, nested sections recursed."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = dataclasses.MISSING
        if _is_section(value) and type(value) is type(default):
            nested = _non_defaults(value)
            if nested:
                out[f.name] = nested
        elif value != default:
            out[f.name] = to_dict(value) if _is_section(value) else value
    return out


def _is_section(value: Any) -> bool:
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def _set_aside(folder: Path) -> None:
    """Rename a stale run's ``folder`` to ``<name>.old-<n>`` (the first free ``n``), kept whole."""
    n = 1
    while folder.with_name(f"{folder.name}.old-{n}").exists():
        n += 1
    aside = folder.with_name(f"{folder.name}.old-{n}")
    folder.rename(aside)
    logger.warning("study: moved the earlier run in %s to %s", folder, aside)


def _finished(path: Path, keys: Sequence[str]) -> dict[str, Any] | None:
    """The result in ``path`` if it was written with settings ``keys`` (any of them), else None."""
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        logger.warning("study: %s is unreadable (%s); running it again.", path, exc)
        return None
    if not isinstance(result, dict) or result.get("settings", {}).get("config_key") not in keys:
        logger.info("study: %s was written with other settings; running it again.", path)
        return None
    return result


def run_study(
    study: Mapping[str, Any],
    *,
    arms: Sequence[str] | None = None,
    seeds: Sequence[int] | None = None,
    progress: bool = True,
    collect: bool = False,
) -> dict[str, Any]:
    """Run (or pick up) the ``arms`` of ``study`` for the ``seeds`` (default: all of the
    file's); write and return the results.

    The table and plot hold every run of the study's arms and seeds (and of ``seeds``)
    finished with the study's current settings, not only the ones run here, so processes
    that run different arms into one ``output_dir`` do not drop each other's rows. With
    ``collect``, nothing is run.
    """
    from .pipeline import run_pipeline, write_json

    for arm in arms or ():
        if arm not in study["arms"]:
            raise did_you_mean("arm", arm, study["arms"])
    start = time.perf_counter()
    to_run = {(arm, seed) for arm in arms or study["arms"] for seed in seeds or study["seeds"]}
    all_seeds = list(dict.fromkeys([*study["seeds"], *(seeds or [])]))
    runs: list[dict[str, Any]] = []
    for seed in all_seeds:
        for arm in study["arms"]:
            config = arm_config(study, arm, seed)
            done, key = Path(config.output_dir) / "eval.json", run_key(config)
            result = _finished(done, (key, run_key(config, with_output_dir=True)))
            if result is None and (collect or (arm, seed) not in to_run):
                if (arm, seed) in to_run:
                    logger.info("study: %s, seed %d has no finished run; left out of the table", arm, seed)
                continue
            if result is None:
                if done.exists():  # another run's folder: its checkpoints must not be resumed
                    _set_aside(done.parent)
                logger.info("study: %s, seed %d", arm, seed)
                pipeline = run_pipeline(config, progress=progress, name=arm)
                assert pipeline.evaluation is not None  # load_study's base has eval on
                result = pipeline.evaluation.to_dict()
                train_s = sum(r["train"]["step_s"] for r in pipeline.state.history)
                result["settings"]["train_s"] = train_s
                if pipeline.start_model is not None:
                    result["settings"]["warm_start"] = pipeline.start_model.name
                result["settings"]["config_key"] = key
                write_json(done, result)
            runs.append({"arm": arm, "seed": seed, "result": result})
    summary = aggregate(runs)
    out = Path(study["output_dir"])
    out.mkdir(parents=True, exist_ok=True)
    # this call's wall time and threads (a study picked up after a stop ran partly in earlier calls)
    timing = {"wall_s": time.perf_counter() - start, "torch_threads": torch.get_num_threads()}
    (out / "results.json").write_text(
        json.dumps({"runs": runs, "arms": summary, "timing": timing}, indent=2) + "\n", encoding="utf-8"
    )
    (out / "results.md").write_text(format_results(summary) + "\n", encoding="utf-8")
    plot_frontier(summary, out / "frontier.png")
    return {"runs": runs, "arms": summary}


def _get(result: Mapping[str, Any], path: tuple[str, ...]) -> float | None:
    value: Any = result
    for key in path:
        if not isinstance(value, Mapping) or key not in value:
            return None
        value = value[key]
    return None if value is None else float(value)


def aggregate(runs: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """Per arm, per column: mean, population std and count over the seeds that have it
    (a missing or NaN value is left out)."""
    values: dict[str, dict[str, list[float]]] = {}
    for run in runs:
        arm = values.setdefault(run["arm"], {})
        for heading, path, scale in COLUMNS:
            value = _get(run["result"], path)
            if value is not None and not math.isnan(value):  # NaN: the probe had no case to measure
                arm.setdefault(heading, []).append(value * scale)
    out: dict[str, dict[str, dict[str, float]]] = {}
    for name, columns in values.items():
        out[name] = {}
        for heading, column in columns.items():
            mean = sum(column) / len(column)
            std = math.sqrt(sum((v - mean) ** 2 for v in column) / len(column))
            out[name][heading] = {"mean": mean, "std": std, "n": float(len(column))}
    return out


def format_results(summary: Mapping[str, Mapping[str, Mapping[str, float]]]) -> str:
    """The study table in Markdown: one row per arm, mean ± std over seeds."""
    headings = [c[0] for c in COLUMNS]
    lines = ["| Arm | Seeds | " + " | ".join(headings) + " |", "|---|---|" + "---|" * len(headings)]
    for arm, cells in summary.items():
        seeds = max((int(c["n"]) for c in cells.values()), default=0)
        row = [f"{cells[h]['mean']:.2f} ± {cells[h]['std']:.2f}" if h in cells else "–" for h in headings]
        lines.append(f"| {arm} | {seeds} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def plot_frontier(summary: Mapping[str, Mapping[str, Mapping[str, float]]], path: Path) -> Path:
    """Two panels, one marker per arm with std error bars: EM against mean searches per
    question (the papers' frontier), and searches on known against unknown questions (a
    frugal policy sits top left: it searches what it does not know, and only that)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (frontier, split) = plt.subplots(1, 2, figsize=(11, 4.5))
    markers = "osD^v<>Pp*Xh"
    panels = (
        (frontier, "ST", "EM", "searches per question (ST)", "EM on held-out questions (%)"),
        (split, "SR known", "SR unknown", "searched, known questions (%)", "searched, unknown questions (%)"),
    )
    for k, (arm, cells) in enumerate(summary.items()):
        for ax, x, y, _, _ in panels:
            if x in cells and y in cells:
                ax.errorbar(
                    cells[x]["mean"],
                    cells[y]["mean"],
                    xerr=cells[x]["std"],
                    yerr=cells[y]["std"],
                    fmt=markers[k % len(markers)],
                    color=f"C{k % 10}",
                    capsize=3,
                    label=arm,
                )
    for ax, _, _, xlabel, ylabel in panels:
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    split.set_xlim(-5, 105)
    split.set_ylim(-5, 105)
    frontier.set_title("Accuracy against search cost")
    split.set_title("Who searches what (mean ± std over seeds)")
    handles, labels = frontier.get_legend_handles_labels()
    if labels:
        fig.legend(handles, labels, loc="center right", fontsize=8)
    fig.tight_layout(rect=(0, 0, 0.86, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
