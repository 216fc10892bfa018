"""The worker hook: TSAS inside OpenRLHF's real ``compute_advantages_and_returns``, and memory steps.

``openrlhf.trainer.ppo_utils.experience_maker`` imports DeepSpeed (through
``openrlhf.models``) and vLLM (through ``openrlhf.trainer.ray``), which a CPU machine does
not have. The fixture below stands in for exactly those two: an empty ``deepspeed`` module,
the ``openrlhf.models`` and ``openrlhf.trainer.ray`` packages without their ``__init__``,
and a one-name ``launcher``. Everything else, the advantage code included, is OpenRLHF's.
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
import types
from types import SimpleNamespace

import pytest

pytest.importorskip("openrlhf.utils.agent", reason="needs openrlhf==0.11.2 (--no-deps)")
torch = pytest.importorskip("torch")

from searchgym.envs.rewards.tsas import tsas_advantages  # noqa: E402
from searchgym.memory.config import MemoryConfig  # noqa: E402
from searchgym.trainers.advantages import AdvantageConfig, build_advantage  # noqa: E402
from searchgym.trainers.agent_config import AgentConfig  # noqa: E402
from searchgym.trainers.openrlhf import advantage_hook  # noqa: E402

TSAS = AdvantageConfig(estimator="tsas")
from searchgym.trainers.openrlhf.flags import check_flags, flatten, openrlhf_parser, to_argv  # noqa: E402

EM = "openrlhf.trainer.ppo_utils.experience_maker"

# R, S, T of six rollouts by rollout index; prompts {0, 1, 2} and {3, 4, 5} (n = 3)
R = [1.0, 0.0, 0.5, 1.0, 1.0, 0.0]
S = [1, 0, 2, 0, 3, 1]
T = [2, 1, 1, 1, 2, 0]
# Worked out with the math module from docs/methods.md#light-search (α = 0.01, population std):
# stage 1, prompt 0 (mean R 0.5): 0.5 + ln 2 + 0.01 ln 3 = 1.2041333; -0.5 + 0.01 ln 2 = -0.4930685;
#   ln 3 + 0.01 ln 2 = 1.1055438. Prompt 1 (mean R 2/3): 1/3 + 0.01 ln 2 = 0.3402648;
#   1/3 + ln 4 + 0.01 ln 3 = 1.7306138; -2/3 + ln 2 = 0.0264805.
STAGE1 = [1.2041333, -0.4930685, 1.1055438, 0.3402648, 1.7306138, 0.0264805]
# stage 2, prompt 0: std S = sqrt(2/3); σ = sigmoid(±0.5) - 0.5 = ±0.1224593, 0 for A+ = 0:
#   0.5 + 0.1224593 (ln 2 - 0.8164966 + ln 3) = 0.6194300; -0.5 - 0.1224593 (-0.8164966 + ln 2) = -0.4848947; 0.
# prompt 1: std S = sqrt(14/9) = 1.2472191; σ(1/3) = 0.0825702, σ(-2/3) = -0.1607563:
#   0.2875835, 0.4355294, -0.5775961.
STAGE2 = [0.6194300, -0.4848947, 0.0, 0.2875835, 0.4355294, -0.5775961]


@pytest.fixture
def experience_maker(monkeypatch):
    """OpenRLHF's experience_maker module, imported with the DeepSpeed/vLLM imports stood in for."""
    base = os.path.dirname(importlib.util.find_spec("openrlhf").origin)

    def package(name, path):
        module = types.ModuleType(name)
        module.__path__ = [path]
        return module

    launcher = types.ModuleType("openrlhf.trainer.ray.launcher")
    launcher.RayActorGroup = object
    before = set(sys.modules)
    monkeypatch.setitem(sys.modules, "deepspeed", types.ModuleType("deepspeed"))
    monkeypatch.setitem(
        sys.modules, "openrlhf.models", package("openrlhf.models", os.path.join(base, "models"))
    )
    monkeypatch.setitem(
        sys.modules,
        "openrlhf.trainer.ray",
        package("openrlhf.trainer.ray", os.path.join(base, "trainer", "ray")),
    )
    monkeypatch.setitem(sys.modules, "openrlhf.trainer.ray.launcher", launcher)
    saved_state = vars(advantage_hook._STATE).copy()
    yield
    for name in set(sys.modules) - before:
        if name.startswith("openrlhf."):
            del sys.modules[name]
    advantage_hook._FINDER.patches.clear()
    if advantage_hook._FINDER in sys.meta_path:
        sys.meta_path.remove(advantage_hook._FINDER)
    vars(advantage_hook._STATE).update(saved_state)


def openrlhf_args(estimator: str = "dr_grpo", n: int = 3):
    """OpenRLHF's own parsed args (its parser and checks) for a 2-prompt batch."""
    flat = flatten(
        {
            "actor": {"model_name_or_path": "m", "num_gpus_per_node": 1},
            "train": {"agent_func_path": "agent.py"},
            "rollout": {"n_samples_per_prompt": n, "batch_size": 2},
            "algo": {"advantage": {"estimator": estimator}, "kl": {"use_loss": True, "estimator": "k3"}},
        }
    )
    args, _ = check_flags(to_argv(flat, openrlhf_parser()), openrlhf_parser())
    return args


def batch(lengths=(4, 3, 5, 2, 6, 3)):
    """Two micro-batches of three rollouts each, out of rollout order (as dynamic batching leaves them)."""
    from openrlhf.trainer.ppo_utils.experience import Experience

    out = []
    for order in ([3, 0, 4], [1, 5, 2]):
        width = 7
        mask = torch.zeros(3, width, dtype=torch.bool)
        for row, i in enumerate(order):
            mask[row, 1 : 1 + lengths[i]] = True  # a masked token first, as env text would be
        out.append(
            Experience(
                action_mask=mask,
                kl=torch.zeros(3, width),
                rewards=torch.tensor([R[i] for i in order]),
                index=list(order),
                info={
                    "num_searches": torch.tensor([float(S[i]) for i in order]),
                    "reasoning_steps": torch.tensor([float(T[i]) for i in order]),
                    "reward": torch.tensor([R[i] for i in order]),
                },
            )
        )
    return out


def maker(module, args, estimator="dr_grpo"):
    m = object.__new__(module.RemoteExperienceMaker)
    m.strategy, m.args, m.advantage_estimator = SimpleNamespace(args=args), args, estimator
    m.kl_ctl = SimpleNamespace(value=0.0)
    return m


def test_hand_values_match_tsas_advantages():
    for stage, expected in ((1, STAGE1), (2, STAGE2)):
        got = tsas_advantages(R[:3], S[:3], T[:3], stage) + tsas_advantages(R[3:], S[3:], T[3:], stage)
        assert got == pytest.approx(expected, abs=1e-6)


def test_shaped_rewards_follow_openrlhf_grouping():
    experiences = batch()
    shaped = advantage_hook.hooked_advantages(experiences, 3, build_advantage(TSAS), step=0)  # stage 1
    by_index = {
        i: float(v) for e, a in zip(experiences, shaped, strict=True) for i, v in zip(e.index, a, strict=True)
    }
    assert [by_index[i] for i in range(6)] == pytest.approx(STAGE1, abs=1e-6)


def test_hook_installed_lazily_wraps_openrlhfs_advantage_code(experience_maker, monkeypatch, tmp_path):
    config = tmp_path / "agent.yaml"
    config.write_text(
        "env: {id: searchgym/SyntheticFacts-v1}\nadvantage: {estimator: tsas, warmup_steps: 150, alpha: 0.01}\n"
    )
    monkeypatch.setenv("SEARCHGYM_AGENT_CONFIG", str(config))
    assert EM not in sys.modules
    advantage_hook.setup_worker()  # what Ray runs in each worker: nothing imported yet
    assert EM not in sys.modules
    module = importlib.import_module(EM)  # the trainer actor imports it: patched on import
    method = module.RemoteExperienceMaker.compute_advantages_and_returns
    assert getattr(method, "__searchgym_wrapped__", False)

    args = openrlhf_args()
    for step, expected in ((0, STAGE1), (149, STAGE1), (150, STAGE2)):
        advantage_hook._STATE.step = step
        experiences = method(maker(module, args), batch())
        assert args.algo.advantage.estimator == "dr_grpo"  # restored after the call
        for e in experiences:
            for row, i in enumerate(e.index):
                mask = e.action_mask[row]
                # every action token carries A_i (KL 0, gamma 1); tokens after the last action get 0
                assert e.advantages[row][mask].tolist() == pytest.approx(
                    [expected[i]] * int(mask.sum()), abs=1e-5
                )
                last = int(mask.nonzero().max())
                assert e.advantages[row][last + 1 :].abs().sum() == 0
                assert float(e.info["reward"][row]) == R[i]  # the env's reward stays in the logs
                assert float(e.info["tsas_stage"][row]) == (1 if step < 150 else 2)


def test_the_eq2_variant_of_tsas_runs_under_openrlhf(experience_maker, monkeypatch, tmp_path):
    """Light-Search's Eq. 2 reading (``advantage.variant: eq2``) reaches OpenRLHF's real advantage code."""
    config = tmp_path / "run.yaml"
    config.write_text(
        "backend: openrlhf\nenv: {id: searchgym/SyntheticFacts-v1}\n"
        "advantage: {estimator: tsas, variant: eq2, warmup_steps: 2, alpha: 0.01}\nopenrlhf: {}\n"
    )
    monkeypatch.setenv("SEARCHGYM_AGENT_CONFIG", str(config))
    advantage_hook.setup_worker()
    module = importlib.import_module(EM)
    method = module.RemoteExperienceMaker.compute_advantages_and_returns
    args = openrlhf_args()
    for step, stage in ((1, 1), (2, 2)):
        advantage_hook._STATE.step = step
        experiences = method(maker(module, args), batch())
        eq2 = [
            *tsas_advantages(R[:3], S[:3], T[:3], stage, 0.01, variant="eq2"),
            *tsas_advantages(R[3:], S[3:], T[3:], stage, 0.01, variant="eq2"),
        ]
        for e in experiences:
            for row, i in enumerate(e.index):
                first = int(e.action_mask[row].nonzero().min())
                assert float(e.advantages[row][first]) == pytest.approx(eq2[i], abs=1e-5)
    assert eq2 != pytest.approx(STAGE2, abs=1e-3)  # stage 2 of Eq. 2 is not Eq. 4's


def test_without_the_hook_dr_grpo_recentres_the_reward(experience_maker):
    """The control: OpenRLHF's own dr_grpo is R - mean R, which is why TSAS needs the hook."""
    module = importlib.import_module(EM)
    assert not getattr(
        module.RemoteExperienceMaker.compute_advantages_and_returns, "__searchgym_wrapped__", False
    )
    experiences = module.RemoteExperienceMaker.compute_advantages_and_returns(
        maker(module, openrlhf_args()), batch()
    )
    means = [sum(R[:3]) / 3, sum(R[3:]) / 3]
    for e in experiences:
        for row, i in enumerate(e.index):
            first = int(e.action_mask[row].nonzero().min())
            assert float(e.advantages[row][first]) == pytest.approx(R[i] - means[i // 3])


def test_tsas_refuses_gae(experience_maker):
    advantage_hook.install(AgentConfig("searchgym/SyntheticFacts-v1", advantage=TSAS))
    module = importlib.import_module(EM)
    with pytest.raises(advantage_hook.SearchGymError, match="estimator"):
        module.RemoteExperienceMaker.compute_advantages_and_returns(
            maker(module, openrlhf_args("gae", 3), "gae"), batch()
        )


def test_missing_extra_logs_are_reported(experience_maker):
    experiences = batch()
    del experiences[1].info["num_searches"]
    with pytest.raises(advantage_hook.SearchGymError, match="num_searches"):
        advantage_hook.hooked_advantages(experiences, 3, build_advantage(TSAS), step=0)


# -- the training step: stage for TSAS, memory updates ---------------------------------------------


def finished_trajectory(question_index: int, good: bool):
    import gymnasium as gym

    from searchgym.envs.synthetic import generate_world

    world = generate_world(0)
    question = world.questions[question_index]
    env = gym.make("searchgym/SyntheticFacts-v1", protocol="tool_call", reward="f1", max_turns=6)
    env.reset(options={"index": question_index})
    if good:
        env.step(f"<think>I know it.</think>\n<answer>{question.golden_answers[0]}</answer>")
    else:  # a malformed turn, two searches, a wrong answer: figures the rule summariser contrasts
        env.step("no tags")
        for query in ("a thing", "another thing"):
            env.step(
                f'<think>x</think>\n<tool_call>{{"name": "search", "arguments": {{"query": "{query}"}}}}</tool_call>'
            )
        env.step("<think>x</think>\n<answer>nobody</answer>")
    return env.unwrapped.trajectory


def test_train_step_publishes_the_step_and_updates_the_memory_every_n_steps(tmp_path):
    from searchgym.memory import ExperienceMemory
    from searchgym.trainers.memory_sync import read_published_step

    store = str(tmp_path / "memory")
    agents = ExperienceMemory(store)  # the rollout side: agents add episodes
    state = advantage_hook._State()
    state.config = AgentConfig(
        "searchgym/SyntheticFacts-v1", memory=MemoryConfig(kind="lightsearcher", path=store, update_every=2)
    )

    def original(self, rollout_samples, global_step):
        return {"loss": 1.0}, global_step + 1

    train_step = advantage_hook.wrap_train_step(original, state)
    for i in range(4):
        agents.add(finished_trajectory(i, good=i % 2 == 0))
    status, step = train_step(None, None, 0)
    assert step == 1 and read_published_step(store) == 1 and state.step == 0
    assert status["memory_updates"] == 0.0 and status["memory_bank_version"] == 0.0
    status, step = train_step(None, None, 1)  # the second step: update_every = 2
    assert read_published_step(store) == 2
    assert status["memory_updates"] == 1.0 and status["memory_bank_version"] == 1.0
    assert len(agents.experience) > 0  # the agents' side reads the new bank from the store

    # a restarted trainer (a fresh process) resumes at its checkpoint's step without repeating updates
    resumed = advantage_hook._State()
    resumed.config = state.config
    train_step = advantage_hook.wrap_train_step(original, resumed)
    status, step = train_step(None, None, 2)
    assert step == 3 and status["memory_updates"] == 0.0 and resumed.stepper.memory.steps == 3


def test_needs_hook():
    bare = AgentConfig("searchgym/SyntheticFacts-v1")
    assert not advantage_hook.needs_hook(bare)
    assert advantage_hook.needs_hook(AgentConfig(bare.env_id, advantage=TSAS))
    assert advantage_hook.needs_hook(
        AgentConfig(bare.env_id, memory=MemoryConfig(kind="lightsearcher", path="m"))
    )
    assert not advantage_hook.needs_hook(
        AgentConfig(bare.env_id, memory=MemoryConfig(kind="hiexp", path="m"))
    )
    assert math.isclose(AdvantageConfig().alpha, 0.01) and AdvantageConfig().warmup_steps == 150


def test_ray_runs_the_hook_in_every_worker_from_the_runtime_env(tmp_path):
    """The real mechanism: a job-level runtime env naming HOOK makes a fresh worker install it."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        pytest.skip("another test left Ray running")
    config = tmp_path / "agent.yaml"
    config.write_text(
        "env: {id: searchgym/SyntheticFacts-v1}\nadvantage: {estimator: tsas, warmup_steps: 7}\n"
    )
    ray.init(
        num_cpus=1,
        include_dashboard=False,
        object_store_memory=100 * 1024**2,
        log_to_driver=False,
        runtime_env={
            "worker_process_setup_hook": advantage_hook.HOOK,
            "env_vars": {"SEARCHGYM_AGENT_CONFIG": str(config)},
        },
    )
    try:

        @ray.remote
        def probe():
            from searchgym.trainers.openrlhf import advantage_hook as hook

            return (
                hook._FINDER in sys.meta_path,
                sorted(hook._FINDER.patches),
                hook._STATE.config.advantage.warmup_steps,
                EM in sys.modules,  # registered, not imported: lazy
            )

        installed, targets, warmup, imported = ray.get(probe.remote(), timeout=120)
    finally:
        ray.shutdown()
    assert installed and warmup == 7 and not imported
    assert targets == ["openrlhf.trainer.ppo_trainer", EM, "openrlhf.trainer.ray.ppo_actor"]
