"""Summarisers: the bank record, trajectory summaries, the rule-based contrasts, LLM backends."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import searchgym  # noqa: F401  (registers the env ids)
from searchgym.envs.records import Action, Question, Trajectory, Turn
from searchgym.error import InvalidArgumentError, UnknownNameError
from searchgym.memory import (
    ExperienceBank,
    ExperienceMemory,
    OpenAISummarizer,
    RuleBasedSummarizer,
    SummarizerError,
    TransformersSummarizer,
    make_summarizer,
    summarise_trajectory,
)
from searchgym.memory.lightsearcher.lm_summarizers import parse_bank
from searchgym.policies import make_policy
from searchgym.retrieval.records import Doc

# -- the bank --------------------------------------------------------------------------------------


def test_bank_text_and_round_trip() -> None:
    bank = ExperienceBank(("Search once.", "Read the passage."), (), ("Be brief.",), step=10, version=2)
    assert bank.to_text() == (
        "Success strategies:\n- Search once.\n- Read the passage.\nReasoning guidelines:\n- Be brief."
    )
    assert len(bank) == 3
    assert ExperienceBank.from_dict(json.loads(json.dumps(bank.to_dict()))) == bank
    with pytest.raises(InvalidArgumentError, match="'pitfalls' must be a list of strings"):
        ExperienceBank.from_dict({"success_strategies": [], "pitfalls": "x", "reasoning_guidelines": []})
    assert ExperienceBank().to_text() == ""


# -- trajectory summaries ---------------------------------------------------------------------------


def _search(query: str, docs: list[Doc]) -> Turn:
    return Turn("…", Action(kind="search", query=query, think_blocks=1), docs, "…")


def test_summary_of_a_hand_made_trajectory() -> None:
    traj = Trajectory(
        Question("q", "Where was the founder of Acme Corp born?", ("New York City", "NYC")),
        "tool_call",
        [
            Turn("oops", Action(kind="invalid", format_ok=False, error="x")),
            _search("founder Acme Corp", [Doc("1", "Acme Corp", "Acme was founded by Jo Smith.")]),
            _search("Jo Smith birthplace", [Doc("2", "Jo Smith", "Jo Smith was born in New York City.")]),
            Turn("…", Action(kind="answer", answer="New York")),
        ],
        reward=-1.0,
    )
    s = summarise_trajectory(traj)
    assert (s.num_searches, s.format_errors, s.answer_words, s.answered) == (2, 1, 2, True)
    assert s.answer_in_docs  # "new york city" occurs in doc 2
    # Query words vs question words {where, was, founder, of, acme, corp, born}:
    # "founder acme corp" → 3/3; "jo smith birthplace" → 0/3; mean 0.5.
    assert s.query_overlap == pytest.approx(0.5)
    # F1("New York", "New York City") = 2·(1·2/3)/(1+2/3) = 0.8
    assert s.f1 == pytest.approx(0.8)
    assert s.explanation == (
        "Reward -1.00: 1 malformed turn; answer 'New York' has F1 0.80 against 'New York City'; "
        "2 searches; the gold answer was in the retrieved passages."
    )
    traj.turns = traj.turns[:1]
    traj.truncated = True
    s = summarise_trajectory(traj)
    assert (
        s.explanation == "Reward -1.00: 1 malformed turn; no final answer before the turn limit; 0 searches."
    )
    assert s.query_overlap is None and not s.answer_in_docs and s.answer_words == 0


# -- the rule-based summariser, by hand ----------------------------------------------------------


def _traj(searches: int, answer: str | None, reward: float, gold: str = "Paris") -> Trajectory:
    turns = [_search(f"capital q{i}", [Doc(str(i), "T", "nothing here")]) for i in range(searches)]
    if answer is not None:
        turns.append(Turn("…", Action(kind="answer", answer=answer)))
    return Trajectory(Question("q", "What is the capital?", (gold,)), "tool_call", turns, reward=reward)


def test_rule_based_by_hand() -> None:
    good = [summarise_trajectory(_traj(1, "Paris", 1.0)), summarise_trajectory(_traj(1, "Paris", 1.0))]
    bad = [summarise_trajectory(_traj(0, "Lyon", 0.0)), summarise_trajectory(_traj(3, "Lyon", 0.0))]
    bank = RuleBasedSummarizer().summarize(good, bad, None)
    # Searches: good (1+1)/2 = 1.00, bad (0+3)/2 = 1.50; gap -0.5 beyond 0.25 → pitfall.
    # No-search share: good 0/2 = 0%, bad 1/2 = 50%; gap -0.5 → pitfall.
    # Query overlap: every query "capital qN" shares 1 of 2 words → 50% in both: no sentence.
    # Gold in docs: never (0% both); format errors: none; unanswered: none; answer words 1 vs 1.
    assert bank.pitfalls == (
        "Do not keep searching once the passages hold the answer: failed trajectories averaged 1.50 "
        "searches, successful ones 1.00.",
        "Do not answer from memory alone when unsure: 50% of failed trajectories made no search, "
        "against 0% of successful ones.",
    )
    assert bank.success_strategies == () and bank.reasoning_guidelines == ()
    # The same trajectories on both sides: no contrast, no sentence at all.
    assert len(RuleBasedSummarizer().summarize(good, good, None)) == 0
    with pytest.raises(InvalidArgumentError, match="share_gap"):
        RuleBasedSummarizer(share_gap=0)


# -- the rule-based summariser on SyntheticFacts rollouts ----------------------------------------


def _norm_words(text: str) -> list[str]:
    # Independent of searchgym's normaliser: lower-case, keep word characters, drop articles.
    return [w for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in ("a", "an", "the")]


def _gold_in_docs(t: Trajectory) -> bool:
    for turn in t.turns:
        for d in turn.docs:
            text = " ".join(_norm_words(d.title + " " + d.text))
            for g in t.question.golden_answers:
                g = " ".join(_norm_words(g))
                if g and re.search(rf"(^| ){re.escape(g)}( |$)", text):
                    return True
    return False


def _independent_stats(group: list[Trajectory]) -> dict[str, float | None]:
    n = len(group)
    overlaps = []
    for t in group:
        q = set(_norm_words(t.question.question))
        shares = [
            len(set(_norm_words(x)) & q) / len(set(_norm_words(x))) for x in t.queries if _norm_words(x)
        ]
        if shares:
            overlaps.append(sum(shares) / len(shares))
    answered = [t for t in group if t.answer is not None]
    return {
        "searches": sum(t.num_searches for t in group) / n,
        "no_search": sum(t.num_searches == 0 for t in group) / n,
        "in_docs": sum(_gold_in_docs(t) for t in group) / n,
        "format": sum(any(not x.action.format_ok for x in t.turns) for t in group) / n,
        "unanswered": sum(t.answer is None for t in group) / n,
        "overlap": sum(overlaps) / len(overlaps) if overlaps else None,
        "words": sum(len(_norm_words(t.answer or "")) for t in answered) / len(answered)
        if answered
        else None,
    }


# Every sentence the rule summariser can write: (regex, statistic, order of the two numbers).
_TEMPLATES = [
    (r"failed trajectories averaged ([\d.]+) searches, successful ones ([\d.]+)\.", "searches", "bg"),
    (r"successful trajectories averaged ([\d.]+) searches, failed ones ([\d.]+)\.", "searches", "gb"),
    (
        r"(\d+)% of successful trajectories answered without searching, against (\d+)% of failed",
        "no_search",
        "gb",
    ),
    (r"(\d+)% of failed trajectories made no search, against (\d+)% of successful", "no_search", "bg"),
    (r"retrieved passages of (\d+)% of successful trajectories, against (\d+)% of failed", "in_docs", "gb"),
    (r"in them for (\d+)% of failed trajectories \(successful: (\d+)%\)", "in_docs", "bg"),
    (r"(\d+)% of failed trajectories had a malformed turn, against (\d+)% of successful", "format", "bg"),
    (r"(\d+)% of failed trajectories ended without one, against (\d+)% of successful", "unanswered", "bg"),
    (
        r"successful queries shared (\d+)% of their words with the question, failed ones (\d+)%",
        "overlap",
        "gb",
    ),
    (r"successful answers averaged ([\d.]+) words, failed ones ([\d.]+)\.", "words", "gb"),
]
_FORMAT = {"searches": "{:.2f}", "words": "{:.1f}"}


def _fmt(stat: str, value: float) -> str:
    return _FORMAT[stat].format(value) if stat in _FORMAT else f"{100 * value:.0f}"


class _Sloppy:
    """Delegates to a scripted policy, but writes a malformed action with probability p."""

    def __init__(self, policy, p: float, rng: np.random.Generator):
        self.policy, self.p, self.rng = policy, p, rng

    def act(self, contexts):
        return ["<think>hmm</think>" if self.rng.random() < self.p else a for a in self.policy.act(contexts)]


def _rollouts(p_direct: float, p_sloppy: float, episodes: int, seed: int) -> list[Trajectory]:
    env = gym.make("searchgym/SyntheticFacts-v1", protocol="tool_call", reward="lightsearcher", max_turns=3)
    world = env.unwrapped.world
    rng = np.random.default_rng(seed)
    direct = make_policy("direct", protocol="tool_call", world=world)
    rag = make_policy("naive_rag", protocol="tool_call", world=world)
    out = []
    for ep in range(episodes):
        agent = _Sloppy(direct if rng.random() < p_direct else rag, p_sloppy, rng)
        context, _ = env.reset(seed=seed * 10_000 + ep)
        done = False
        while not done:
            action = agent.act([context])[0]
            obs, _, terminated, truncated, _ = env.step(action)
            context += action + obs
            done = terminated or truncated
        out.append(env.unwrapped.trajectory)
    return out


def _check_bank_against_rollouts(bank: ExperienceBank, trajectories: list[Trajectory]) -> set[str]:
    good = [t for t in trajectories if t.reward is not None and t.reward >= 1.0 - 1e-9]
    bad = [t for t in trajectories if t.reward is not None and t.reward < 0.3]
    g, b = _independent_stats(good), _independent_stats(bad)
    fired = set()
    for _, items in bank.groups():
        for sentence in items:
            matches = [(m, stat, order) for rx, stat, order in _TEMPLATES if (m := re.search(rx, sentence))]
            assert len(matches) == 1, f"unrecognised or ambiguous sentence: {sentence}"
            m, stat, order = matches[0]
            quoted = dict(zip(order, m.groups(), strict=True))
            assert quoted == {"g": _fmt(stat, g[stat]), "b": _fmt(stat, b[stat])}, (
                sentence,
                g[stat],
                b[stat],
            )
            # Nothing else in the sentence is a number.
            assert sorted(re.findall(r"\d+(?:\.\d+)?", sentence)) == sorted(m.groups()), sentence
            fired.add(stat)
    # And a sentence appears exactly when the independent gap reaches the default margin.
    expected = set()
    for stat, margin in [
        ("searches", 0.25),
        ("no_search", 0.1),
        ("in_docs", 0.1),
        ("overlap", 0.1),
        ("words", 1.0),
    ]:
        if g[stat] is not None and b[stat] is not None and abs(g[stat] - b[stat]) >= margin:
            expected.add(stat)
    for stat in ("format", "unanswered"):
        if b[stat] - g[stat] >= 0.1:
            expected.add(stat)
    assert fired == expected, (fired, expected, g, b)
    return fired


def test_rule_based_guidance_follows_the_measured_contrast() -> None:
    summarizer = RuleBasedSummarizer()
    texts, fired = [], []
    for p_direct, p_sloppy, seed in [(0.5, 0.0, 1), (0.85, 0.25, 2)]:
        trajectories = _rollouts(p_direct, p_sloppy, episodes=160, seed=seed)
        good = [summarise_trajectory(t) for t in trajectories if t.reward >= 1.0]  # type: ignore[operator]
        bad = [summarise_trajectory(t) for t in trajectories if t.reward < 0.3]  # type: ignore[operator]
        assert good and bad
        bank = summarizer.summarize(good, bad, None)
        fired.append(_check_bank_against_rollouts(bank, trajectories))
        texts.append(bank.to_text())
    assert texts[0] and texts[1] and texts[0] != texts[1]
    assert "format" in fired[1] and "format" not in fired[0]  # only the sloppy mix has malformed turns


# -- parsing a model's reply --------------------------------------------------------------------------


def test_parse_bank_reads_headings_in_several_styles() -> None:
    reply = (
        "Here is the guidance.\n- stray item outside a heading\n"
        "## Success strategies\n- Search for the missing fact.\n* Quote the passage.\n"
        "**Pitfalls to avoid:**\n1. Repeating the same query.\n2) x\n"
        "Reasoning guidelines:\n• Think in two hops.\n- Think in two hops.\n"
    )
    bank = parse_bank(reply)
    assert bank.success_strategies == ("Search for the missing fact.", "Quote the passage.")
    assert bank.pitfalls == ("Repeating the same query.",)  # "x" is too short
    assert bank.reasoning_guidelines == ("Think in two hops.",)  # the duplicate is dropped
    with pytest.raises(SummarizerError, match="no bullet points"):
        parse_bank("Sure! The agent did fine overall.")


def test_make_summarizer_forms() -> None:
    assert isinstance(make_summarizer("rule"), RuleBasedSummarizer)
    s = make_summarizer("openai:Qwen/Qwen2.5-7B@http://127.0.0.1:8000/v1")
    assert isinstance(s, OpenAISummarizer) and s.model == "Qwen/Qwen2.5-7B" and s.base_url.endswith("/v1")
    assert make_summarizer("transformers:/models/x").name == "transformers:/models/x"
    with pytest.raises(UnknownNameError, match="rule, transformers:PATH, openai:MODEL@URL"):
        make_summarizer("rules")
    with pytest.raises(InvalidArgumentError, match="openai:MODEL@URL"):
        make_summarizer("openai:model-without-url")
    with pytest.raises(InvalidArgumentError, match="summarize"):
        make_summarizer(3)  # type: ignore[arg-type]


# -- an OpenAI-compatible server on loopback ------------------------------------------------------

_GOOD_REPLY = (
    "Success strategies:\n- Search once for the missing fact.\n"
    "Pitfalls to avoid:\n- Repeating a query that found nothing.\n"
    "Reasoning guidelines:\n- Name the bridge entity before the second search."
)


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        server = self.server
        server.requests.append((self.path, body, self.headers.get("Authorization")))  # type: ignore[attr-defined]
        mode = server.modes.pop(0) if server.modes else "good"  # type: ignore[attr-defined]
        try:
            if mode == "slow":
                time.sleep(1.5)
            if mode == "500":
                self.send_error(500, "overloaded")
                return
            if mode == "garbage":
                payload = b"<html>502 Bad Gateway</html>"
            else:
                text = _GOOD_REPLY if mode in ("good", "slow") else "I think the agent did fine."
                payload = json.dumps(
                    {"choices": [{"message": {"role": "assistant", "content": text}}]}
                ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (timeout test)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def chat_server() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    server.block_on_close = False
    server.requests, server.modes = [], []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _url(server: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}/v1"


def _groups() -> tuple[list, list]:
    good = [summarise_trajectory(_traj(1, "Paris", 1.0))]
    bad = [summarise_trajectory(_traj(0, "Lyon", 0.0))]
    return good, bad


def test_openai_summarizer_reads_a_reply(chat_server: ThreadingHTTPServer) -> None:
    s = OpenAISummarizer(_url(chat_server), "tiny", api_key="k", timeout=5, retries=0)
    previous = ExperienceBank(pitfalls=("Old advice.",))
    bank = s.summarize(*_groups(), previous)
    assert bank.success_strategies == ("Search once for the missing fact.",)
    assert bank.reasoning_guidelines == ("Name the bridge entity before the second search.",)
    path, body, auth = chat_server.requests[0]  # type: ignore[attr-defined]
    assert path == "/v1/chat/completions" and auth == "Bearer k" and body["model"] == "tiny"
    user = body["messages"][1]["content"]
    assert "Reward 1.00: answer 'Paris' has F1 1.00" in user and "Old advice." in user


def test_openai_summarizer_retries_then_succeeds(chat_server: ThreadingHTTPServer) -> None:
    chat_server.modes[:] = ["500", "good"]  # type: ignore[attr-defined]
    s = OpenAISummarizer(_url(chat_server), "tiny", timeout=5, retries=1, backoff=0)
    assert len(s.summarize(*_groups(), None)) == 3
    assert len(chat_server.requests) == 2  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("modes", "message", "requests"),
    [
        (["slow", "slow"], "failed 2 times; last: no answer within 0.3 s", 2),
        (["garbage"], "not a chat completion", 1),
        (["prose"], "no bullet points", 1),
    ],
)
def test_openai_summarizer_failures(chat_server: ThreadingHTTPServer, modes, message, requests) -> None:
    chat_server.modes[:] = modes  # type: ignore[attr-defined]
    s = OpenAISummarizer(_url(chat_server), "tiny", timeout=0.3, retries=1, backoff=0)
    with pytest.raises(SummarizerError, match=re.escape(message)):
        s.summarize(*_groups(), None)
    assert len(chat_server.requests) == requests  # type: ignore[attr-defined]


def test_memory_keeps_its_bank_when_the_server_sends_garbage(chat_server: ThreadingHTTPServer) -> None:
    memory = ExperienceMemory(update_every=1, summarizer=OpenAISummarizer(_url(chat_server), "m", retries=0))
    memory.add(_traj(1, "Paris", 1.0))
    memory.add(_traj(0, "Lyon", 0.0))
    assert memory.step().outcome == "written"  # type: ignore[union-attr]
    first = memory.experience
    chat_server.modes[:] = ["garbage"]  # type: ignore[attr-defined]
    memory.add(_traj(1, "Paris", 1.0))
    memory.add(_traj(0, "Lyon", 0.0))
    result = memory.step()
    assert result is not None and result.outcome == "failed" and "not a chat completion" in result.reason
    assert memory.experience == first


# -- a tiny local transformers model ---------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    import torch

    folder = tmp_path_factory.mktemp("tiny-llama")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<unk>", "<s>", "</s>", "<pad>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
    )
    corpus = [_GOOD_REPLY, "Episodes that scored well and poorly, with rewards and searches."] * 20
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    fast.save_pretrained(folder)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=len(fast),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=8192,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return str(folder)


def test_transformers_summarizer_junk_keeps_the_previous_bank(tiny_model: str) -> None:
    s = TransformersSummarizer(tiny_model, max_new_tokens=24, max_examples=2)
    system, user = "Coach the agent.", "Write guidance."
    reply = s.generate(system, user)
    assert isinstance(reply, str)  # the model runs; an untrained one writes junk
    with pytest.raises(SummarizerError, match="no bullet points"):
        s.summarize(*_groups(), None)
    memory = ExperienceMemory(update_every=1)
    memory.add(_traj(1, "Paris", 1.0))
    memory.add(_traj(0, "Lyon", 0.0))
    assert memory.step().outcome == "written"  # type: ignore[union-attr]  (rule-based first)
    first = memory.experience
    memory.summarizer = make_summarizer(f"transformers:{tiny_model}")
    memory.summarizer.max_new_tokens = 24  # type: ignore[attr-defined]
    memory.add(_traj(1, "Paris", 1.0))
    memory.add(_traj(0, "Lyon", 0.0))
    result = memory.step()
    assert result is not None and result.outcome == "failed" and "no bullet points" in result.reason
    assert memory.experience == first


def test_transformers_summarizer_missing_model(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    with pytest.raises(SummarizerError, match="Cannot load a causal LM"):
        TransformersSummarizer(str(tmp_path / "nothing")).generate("s", "u")
