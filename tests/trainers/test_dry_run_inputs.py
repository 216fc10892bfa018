"""The built-in trainer's dry run checks the device it is told to train on (issue 47)."""

from __future__ import annotations

import pytest

from searchgym.cli import main

torch = pytest.importorskip("torch")


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="this machine has CUDA: model.device: cuda is fine here"
)
@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_a_cuda_device_on_a_machine_without_one_stops_the_dry_run(tmp_path, capsys, device):
    path = tmp_path / "run.yaml"
    path.write_text(
        f"builtin:\n  steps: 2\n  output_dir: {tmp_path / 'out'}\n  model: {{tiny: {{}}, device: '{device}'}}\n"
    )
    assert main(["train", "--config", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1 and f"builtin.model.device: '{device}', but this machine has no CUDA device" in err[0]
    )
    path.write_text(
        f"builtin:\n  steps: 2\n  output_dir: {tmp_path / 'out'}\n  model: {{tiny: {{}}, device: auto}}\n"
    )
    assert main(["train", "--config", str(path), "--dry-run"]) == 0  # the fix the message gives


@pytest.mark.parametrize("native", [False, True])
def test_the_dry_run_warns_about_bfloat16_autocast_on_a_cpu_that_emulates_it(
    tmp_path, capsys, monkeypatch, native
):
    from searchgym.trainers.grpo import model as model_module

    monkeypatch.setattr(model_module, "cpu_has_bfloat16", lambda: native)  # the CPU's features
    path = tmp_path / "run.yaml"
    path.write_text(
        f"builtin:\n  steps: 2\n  output_dir: {tmp_path / 'out'}\n"
        "  model: {tiny: {}, device: cpu, autocast: bfloat16}\n"
    )
    assert main(["train", "--config", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert ("warning: builtin.model.autocast is bfloat16, but this CPU" in out) is not native
