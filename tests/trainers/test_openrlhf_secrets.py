"""The W&B key of an OpenRLHF run: never printed, and still what OpenRLHF's W&B logger logs in with."""

from __future__ import annotations

import io
import json
import os
import subprocess
from unittest import mock

import pytest
from test_openrlhf_launch import BASE, write

from searchgym.error import InvalidArgumentError
from searchgym.trainers.openrlhf import compose, launch, load_run_config
from searchgym.trainers.openrlhf.flags import check_flags, openrlhf_parser

pytestmark = pytest.mark.skipif(openrlhf_parser() is None, reason="needs openrlhf==0.11.2 (--no-deps)")

KEY = "0123456789abcdef0123456789abcdef01234567"  # a W&B key is 40 hex digits
WANDB = "  logger: {wandb: {key: %s, project: p, run_name: r}}\n"
SUBMIT = "  launch: {ray_address: 'http://10.0.0.1:8265'}\n"  # openrlhf.launch, after WANDB's line


def run_file(tmp_path, key: str = KEY, extra: str = ""):
    return write(tmp_path, BASE + WANDB % key + extra)


@pytest.mark.parametrize("extra", ["", SUBMIT], ids=["local", "ray-job-submit"])
def test_the_dry_run_never_prints_the_key(tmp_path, monkeypatch, capsys, extra):
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    assert launch(run_file(tmp_path, extra=extra), dry_run=True, out=out) == 0
    printed = out.getvalue() + "".join(capsys.readouterr())
    assert "--logger.wandb.key" in printed  # W&B stays on ...
    assert KEY not in printed  # ... without the key in sight


def test_the_key_reaches_openrlhfs_wandb_logger_through_the_environment(tmp_path, monkeypatch):
    """The trainer actor's environment is the runtime env ``train_ppo`` starts Ray with; there
    OpenRLHF's real ``WandbLogger`` finds the key through wandb's own lookup and logs in with it."""
    import wandb
    from openrlhf.utils.logging_utils import WandbLogger

    from searchgym.trainers.openrlhf import train_ppo

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    plan = compose(load_run_config(run_file(tmp_path)))
    args, _ = check_flags(plan.flags, openrlhf_parser())
    for name, value in {**plan.env, **plan.secrets}.items():  # what `launch` runs train_ppo with
        monkeypatch.setenv(name, value)
    for name, value in train_ppo.runtime_env()["env_vars"].items():  # what Ray gives the actor
        monkeypatch.setenv(name, value)
    logins, inits = [], []
    try:
        with (
            mock.patch.object(wandb, "login", side_effect=lambda **kw: logins.append(kw)),
            mock.patch.object(wandb, "init", side_effect=lambda **kw: inits.append(kw)),
            mock.patch.object(wandb, "define_metric"),
            mock.patch.object(wandb, "Table"),
        ):
            WandbLogger(args)
    finally:
        wandb.teardown()  # wandb's process-wide settings, read from this test's environment, go with it
    assert os.environ["WANDB_API_KEY"] == KEY and logins == []  # wandb took the key from the environment
    (init,) = inits
    assert init["project"] == "p" and KEY not in repr(init["config"])  # the run's config holds no key


def test_a_submitted_job_carries_the_key_in_its_runtime_env_and_prints_a_reference(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plan = compose(load_run_config(run_file(tmp_path, extra=SUBMIT)))
    runtime_env = json.loads(plan.command[plan.command.index("--runtime-env-json") + 1])
    assert runtime_env["env_vars"]["WANDB_API_KEY"] == KEY  # every worker of the job gets it
    line = plan.shell()
    assert KEY not in line and '"$WANDB_API_KEY"' in line
    # pasted into a shell that exports the key, the printed line is the same command
    done = subprocess.run(
        ["bash", "-c", f'set -- {line}; printf "%s\\0" "$@"'],
        env={"WANDB_API_KEY": KEY, "PATH": os.environ["PATH"]},
        capture_output=True,
        check=True,
    )
    assert done.stdout.decode().split("\0")[:-1] == plan.command


def test_key_true_takes_the_key_from_the_launching_environment(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = run_file(tmp_path, key="true")
    monkeypatch.setenv("WANDB_API_KEY", KEY)
    plan = compose(load_run_config(path))
    assert plan.secrets == {"WANDB_API_KEY": KEY} and KEY not in plan.shell()
    monkeypatch.delenv("WANDB_API_KEY")
    assert any("WANDB_API_KEY is not set" in w for w in compose(load_run_config(path)).warnings)
    with (
        mock.patch("subprocess.run") as started,
        pytest.raises(InvalidArgumentError, match="export WANDB_API_KEY"),
    ):
        launch(path, out=io.StringIO())
    started.assert_not_called()  # stopped before it starts


def test_no_key_leaves_wandb_off(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_API_KEY", KEY)
    for key in ("null", "false", '""'):
        plan = compose(load_run_config(run_file(tmp_path, key=key)))
        assert "--logger.wandb.key" not in plan.flags and plan.secrets == {}
