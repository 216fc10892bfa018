"""``searchgym eval`` loads an ``hf:`` policy in bfloat16 on a CPU with fast bfloat16, and says what it chose."""

from __future__ import annotations

import pytest

from searchgym.cli import main
from searchgym.commands import eval as eval_command


def test_the_cpu_flags_are_read_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_bf16 amx_tile amx_bf16\n")
    assert eval_command.fast_bf16_flags(str(info)) == ["amx_bf16", "avx512_bf16"]
    info.write_text("processor\t: 0\nflags\t\t: fpu sse avx2\n")
    assert eval_command.fast_bf16_flags(str(info)) == []
    assert eval_command.fast_bf16_flags(str(tmp_path / "absent")) == []


def test_the_spec_wins_and_other_policies_get_nothing(monkeypatch):
    monkeypatch.setattr(eval_command, "fast_bf16_flags", lambda: ["amx_bf16"])
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("on a GPU the folder's dtype is kept")
    options, line = eval_command.hf_defaults("hf:/m?max_new_tokens=96")
    assert options == {"dtype": "bfloat16"}
    assert (
        line is not None
        and "bfloat16 (this CPU has fast bfloat16: amx_bf16)" in line
        and "up to 96 new" in line
    )
    options, line = eval_command.hf_defaults("hf:/m?dtype=float32")
    assert (
        options == {}
        and line is not None
        and "float32 (from the spec)" in line
        and "512 (the default)" in line
    )
    assert eval_command.hf_defaults("naive_rag") == ({}, None)


def test_eval_builds_the_hf_policy_in_bfloat16_and_prints_the_choice(monkeypatch, tmp_path, capsys):
    pytest.importorskip("transformers")
    import torch

    import searchgym.policies as policies
    from searchgym.policies.tiny import build_tiny_lm

    if torch.cuda.is_available():
        pytest.skip("on a GPU the folder's dtype is kept")
    model = build_tiny_lm(tmp_path / "tiny", hidden_size=32, num_layers=1)
    built = []
    real = policies.make_policy

    def recording(*args, **kwargs):
        built.append(real(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(policies, "make_policy", recording)
    monkeypatch.setattr(eval_command, "fast_bf16_flags", lambda: ["avx512_bf16"])
    spec = f"hf:{model}?max_new_tokens=2"
    assert main(["eval", "--policy", spec, "--episodes", "1", "--max-turns", "1", "--no-progress"]) == 0
    assert next(built[0].model.parameters()).dtype == torch.bfloat16
    assert f"hf:{model}: bfloat16 (this CPU has fast bfloat16: avx512_bf16) on cpu, up to 2 new tokens" in (
        capsys.readouterr().err
    )
