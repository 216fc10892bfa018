"""The recipes under ``examples/openrlhf/``: every program call they make, parsed by that program's
real parser (huggingface_hub's ``hf``, searchgym's, the scripts', Ray's, OpenRLHF's through
``searchgym train --dry-run``), and the files each step reads made by an earlier step."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from recipe_commands import (
    HUB,
    ROOT,
    Call,
    Checked,
    RecipeCallError,
    check_call,
    check_calls,
    check_ray,
    downloaded,
    run_recipe,
)

from searchgym.trainers.openrlhf.flags import openrlhf_parser

RECIPES = ROOT / "examples" / "openrlhf"
pytestmark = [
    pytest.mark.skipif(openrlhf_parser() is None, reason="needs openrlhf==0.11.2 (--no-deps)"),
    pytest.mark.slow,  # each recipe starts Python processes
]


def training_rows(folder: Path) -> Path:
    """LightSearcher's 7,000 training rows as `searchgym prepare` writes them (the dry run counts them)."""
    path = folder / "data" / "lightsearcher_train.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"prompt": f"q{i}", "label": "{}"}) + "\n" for i in range(7000)))
    return path


def only(checked: list[Checked], kind: str) -> list[Checked]:
    return [item for item in checked if item.kind == kind]


def test_prepare_data_downloads_what_it_prepares(tmp_path):
    checked = check_calls(run_recipe("prepare_data.sh", tmp_path))
    data = tmp_path / "data"
    fetched = downloaded(checked)
    for item in only(checked, "hf download"):
        assert (
            item.parsed["function"] == "snapshot_download" and item.parsed["kwargs"]["repo_type"] == "dataset"
        )
    # FlashRAG's repository holds every benchmark: the recipe fetches MuSiQue's and 2Wiki's folders only.
    flashrag = next(
        i
        for i in only(checked, "hf download")
        if i.parsed["kwargs"]["repo_id"] == "RUC-NLPIR/FlashRAG_datasets"
    )
    assert sorted(flashrag.parsed["files"]) == sorted(
        f for f in HUB["RUC-NLPIR/FlashRAG_datasets"] if f.startswith(("musique/", "2wikimultihopqa/"))
    )
    prepares = only(checked, "searchgym prepare")
    assert [p.parsed.dataset for p in prepares] == [["nq"], ["musique:3000", "2wikimultihopqa:4000"]]
    for prepare in prepares:
        assert {Path(prepare.call.cwd, p) for p in prepare.parsed.data_path} <= fetched
    for copy in only(checked, "cp"):
        assert Path(copy.call.cwd, copy.call.args[0]) in fetched
    assert (data / "musique_train.jsonl").is_file() and (data / "musique_dev.jsonl").is_file()


def run_file(tmp_path: Path, prompts: Path) -> Path:
    """The recipe's run file with its training rows at ``prompts`` (relative paths are taken from
    the launch directory, the repository root, where the tests write nothing)."""
    run = tmp_path / "lightsearcher.yaml"
    run.write_text(
        f"extends: {ROOT / 'configs' / 'openrlhf' / 'lightsearcher.yaml'}\n"
        f"openrlhf: {{data: {{prompt_dataset: {prompts}}}}}\n"
    )
    return run


def test_one_node_recipe_calls_pass_their_parsers(tmp_path):
    # the run reads the rows the recipe's `searchgym prepare` writes
    run = run_file(tmp_path, tmp_path / "data" / "lightsearcher_train.jsonl")
    checked = check_calls(run_recipe("one_node_8gpu.sh", tmp_path, CONFIG=str(run)))
    index = tmp_path / "data" / "wiki18"
    # the downloads give Search-R1's layout, which the recipe reassembles for the server
    (serve,) = only(checked, "searchgym serve")
    assert Path(serve.call.cwd, serve.parsed.index).read_bytes() == b"".join(
        (index / name).read_bytes() for name in HUB["PeterJinGo/wiki-18-e5-index"]
    )
    assert Path(serve.call.cwd, serve.parsed.corpus).is_file()
    # the server's readiness probe is a request the server accepts, sent where it listens
    (probe,) = only(checked, "curl")
    server = f"http://{serve.parsed.host}:{serve.parsed.port}"
    assert probe.parsed["url"].startswith(server + "/") and probe.parsed["request"] is not None
    # training: the run file checked by `searchgym train --dry-run` and OpenRLHF's parser
    ((args, plan),) = [item.parsed for item in only(checked, "searchgym train")]
    flags = openrlhf_parser().parser.parse_args(plan.flags)
    assert getattr(flags, "actor.num_gpus_per_node") == 8
    from searchgym.trainers.openrlhf import load_run_config

    assert load_run_config(args.config).agent.env_kwargs["retriever"] == server
    # evaluation reads the model training saves, through the same server, on prepared questions
    (evaluate,) = only(checked, "python evaluate.py")
    assert Path(evaluate.call.cwd, evaluate.parsed.model).resolve() == Path(getattr(flags, "ckpt.output_dir"))
    assert evaluate.parsed.retriever == server
    assert Path(evaluate.call.cwd, evaluate.parsed.data).is_file()


def test_multi_node_recipe_calls_pass_their_parsers(tmp_path):
    head = check_calls(
        run_recipe("multi_node.sh", tmp_path / "head", ROLE="head", HEAD="10.0.0.1", RECIPE_SERVE_SECONDS="0")
    )
    (start,) = only(head, "ray start")
    assert start.parsed["head"] and start.parsed["num_gpus"] == 8
    (serve,) = only(head, "searchgym serve")
    assert serve.parsed.host == "0.0.0.0"  # reached from the other nodes
    worker = check_calls(run_recipe("multi_node.sh", tmp_path / "worker", ROLE="worker", HEAD="10.0.0.1"))
    assert only(worker, "ray start")[0].parsed["address"] == f"10.0.0.1:{start.parsed['port']}"

    shared = tmp_path / "shared"
    launch = training_rows(tmp_path / "launch").parents[1]  # the run file's paths are relative to it
    submit = check_calls(
        run_recipe(
            "multi_node.sh",
            tmp_path / "submit",
            cwd=launch,
            ROLE="submit",
            SHARED=str(shared),
            HEAD="10.0.0.1",
        )
    )
    ((args, plan),) = [item.parsed for item in only(submit, "searchgym train")]
    from searchgym.trainers.openrlhf import load_run_config

    config = load_run_config(args.config)
    assert config.agent.env_kwargs["retriever"] == f"http://10.0.0.1:{serve.parsed.port}"
    # the command the launcher composes is one Ray's own CLI takes, running OpenRLHF's entry point
    assert plan.command[0] == "ray"
    job = check_ray(Call("ray", tuple(plan.command[1:]), str(ROOT)))
    assert job.kind == "ray job submit" and job.parsed["address"] == "http://10.0.0.1:8265"
    assert list(job.parsed["entrypoint"]) == ["python3", "-m", "openrlhf.cli.train_ppo_ray", *plan.flags]
    flags = openrlhf_parser().parser.parse_args(plan.flags)
    assert getattr(flags, "actor.num_nodes") == 2 and getattr(flags, "vllm.num_engines") == 16


def _shell_lines(text: str) -> list[str]:
    """The command lines of the bash blocks of a Markdown file, continuation lines joined."""
    lines = []
    for block in re.findall(r"```(?:bash|sh|shell)\n(.*?)```", text, flags=re.S):
        lines += block.replace("\\\n", " ").splitlines()
    return lines


DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "examples").rglob("*.md")])


@pytest.mark.parametrize("page", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_hub_commands_pass_the_hf_parser(page):
    for line in _shell_lines(page.read_text(encoding="utf-8")):
        words = shlex.split(line, comments=True)
        if words and words[0] in ("hf", "huggingface-cli"):
            check_call(Call(words[0], tuple(words[1:]), str(ROOT)))


def _recipe(tmp_path: Path, body: str) -> str:
    script = tmp_path / "recipe.sh"
    script.write_text("set -euo pipefail\n" + body, encoding="utf-8")
    return str(script)


@pytest.mark.parametrize(
    ("line", "error"),
    [
        # the CLI of huggingface_hub < 1.0: a stub in 1.x, which OpenRLHF 0.11.2 requires
        (
            "huggingface-cli download PeterJinGo/wiki-18-corpus --repo-type dataset --local-dir d",
            "exits with status 1",
        ),
        # hf takes one pattern per --include: the second is read as a file name and --include is dropped
        (
            'hf download RUC-NLPIR/FlashRAG_datasets --repo-type dataset --include "musique/*" "2wikimultihopqa/*" --local-dir d',
            "Ignoring `--include`",
        ),
        ("hf download PeterJinGo/wiki-18-corpus --repo-type datasets --local-dir d", "hf rejects it"),
        ("searchgym serve --index i --corpus c --prot 8000", "searchgym rejects it"),
        ("wget https://example.com/data.zip", "wget: command not found"),
    ],
)
def test_a_call_its_program_rejects_fails_the_recipe(tmp_path, line, error):
    with pytest.raises(RecipeCallError, match=re.escape(error)):
        check_calls(run_recipe(_recipe(tmp_path, line), tmp_path, RECIPE_SERVE_SECONDS="0"))


def test_evaluate_call_with_a_misspelled_flag_is_caught(tmp_path):
    line = "python examples/openrlhf/evaluate.py --model m --data d --epsiodes 10"
    with pytest.raises(RecipeCallError, match="unrecognized arguments: --epsiodes 10"):
        check_calls(run_recipe(_recipe(tmp_path, line), tmp_path, RECIPE_SERVE_SECONDS="0"))


@pytest.mark.parametrize(
    ("script", "env"),
    [
        ("prepare_data.sh", {}),
        ("one_node_8gpu.sh", {"CONFIG": "rows"}),
        ("multi_node.sh", {"ROLE": "submit"}),
    ],
)
def test_dry_run_changes_nothing(tmp_path, script, env):
    # the train step's dry run counts the rows a real step 3 (or prepare_data.sh) would have written
    rows = training_rows(tmp_path / "rows")
    if env.get("CONFIG") == "rows":
        env = {"CONFIG": str(run_file(tmp_path, rows))}
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    done = subprocess.run(
        ["bash", str(RECIPES / script)],
        cwd=ROOT if script != "multi_node.sh" else rows.parents[1],  # its run file's paths are relative
        env={
            **os.environ,
            "PATH": path,
            "DRY_RUN": "1",
            "DATA": str(tmp_path / "data"),
            "SHARED": str(tmp_path),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert not (tmp_path / "data").exists()
