"""Simulated search: generated documents, seeded noise, and the three kinds of generator."""

from __future__ import annotations

import json
import math
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import gymnasium as gym
import pytest

import searchgym
from searchgym.envs.synthetic import RELATIONS, generate_world
from searchgym.envs.synthetic_docs import SyntheticDocGenerator
from searchgym.error import InvalidArgumentError, RetrievalError
from searchgym.policies import Policy, evaluate, make_policy
from searchgym.retrieval import make_retriever
from searchgym.retrieval.records import Doc
from searchgym.retrieval.simulated import (
    MAX_DOC_CHARS,
    DocRequest,
    SimulatedRetriever,
    openai_generator,
    parse_doc,
    read_doc_prompt,
    render_doc_prompt,
    transformers_generator,
)

SYNTHETIC = "searchgym/SyntheticFacts-v1"


@pytest.fixture(scope="module")
def world():
    return generate_world(0)


def judge(world, doc: Doc) -> bool | None:
    """True if ``doc`` states a false fact of ``world``, False if a true one, None if neither."""
    for relation in RELATIONS.values():
        obj = relation.read(doc.text, doc.title)
        if obj is not None:
            fact = world.lookup(doc.title, relation.name)
            return fact is None or fact.object != obj
    return None


def fact_queries(world) -> list[str]:
    return [RELATIONS[f.relation].query(f.subject) for f in world.facts]


# -- the SyntheticFacts generator -----------------------------------------------------------


def test_noise_free_documents_are_the_asked_facts(world):
    retriever = SimulatedRetriever(SyntheticDocGenerator(world))
    # The world's own search queries, and every one-hop question as a query: result 0 is
    # the passage of exactly the fact asked about; the others are true facts too.
    one_hop = [(q.question, world.chain(q.id)[0]) for q in world.questions if q.hops == 1]
    pairs = list(zip(fact_queries(world), world.facts, strict=True)) + one_hop
    results = retriever.search([query for query, _ in pairs], 3)
    for (query, fact), docs in zip(pairs, results, strict=True):
        assert len(docs) == 3
        assert docs[0].title == fact.subject, query
        assert RELATIONS[fact.relation].read(docs[0].text, fact.subject) == fact.object, query
        assert all(judge(world, d) is False for d in docs)


def test_oracle_as_accurate_as_with_bm25(world):
    oracle = make_policy("oracle_synthetic", world=world)
    bm25 = evaluate(lambda: gym.make(SYNTHETIC), oracle, 471, progress=False)
    simulated = evaluate(lambda: gym.make(SYNTHETIC, retriever="simulated"), oracle, 471, progress=False)
    assert simulated.em == bm25.em == 1.0  # README: the oracle answers every question right
    assert simulated.st == bm25.st


def test_full_noise_breaks_exactly_the_unknown_one_hop_questions(world):
    """At noise_prob=1 every document is wrong, so the oracle gets a one-hop question right
    exactly when it knows the fact without searching: EM = share of known one-hop questions."""
    one_hop = [q for q in world.questions if q.hops == 1]
    expected = sum(q.known for q in one_hop) / len(one_hop)
    result = evaluate(
        lambda: gym.make(SYNTHETIC, retriever="simulated", retriever_kwargs={"noise_prob": 1.0}),
        make_policy("oracle_synthetic", world=world),
        471,
        progress=False,
    )
    assert result.splits["1-hop"]["em"] == pytest.approx(expected)
    assert 0.3 < expected < 0.7  # the default known_fraction is 0.5, so this test has teeth


def test_share_of_wrong_documents_is_binomial(world):
    # 330 fact queries x 3 documents x 3 seeds = 2970 documents, each wrong with p = 0.3
    # independently. Mean 2970 * 0.3 = 891; sd = sqrt(2970 * 0.3 * 0.7) = sqrt(623.7) = 24.97.
    # Four sd (99.9) either side: 791 <= wrong <= 991, i.e. a share in [0.2663, 0.3337];
    # a correct implementation falls outside with probability about 6e-5.
    p, docs_per_query, seeds = 0.3, 3, (0, 1, 2)
    queries = fact_queries(world)
    total = len(queries) * docs_per_query * len(seeds)
    wrong = 0
    for seed in seeds:
        retriever = SimulatedRetriever(SyntheticDocGenerator(world), noise_prob=p, seed=seed)
        for query, docs in zip(queries, retriever.search(queries, docs_per_query), strict=True):
            for slot, doc in enumerate(docs):
                verdict = judge(world, doc)
                assert verdict is not None  # a noisy document still reads as a world passage
                assert verdict == retriever.is_noisy(query, slot)
                wrong += verdict
    assert total == 2970
    mean, sd = total * p, math.sqrt(total * p * (1 - p))
    assert abs(wrong - mean) <= 4 * sd, (wrong, mean, sd)


def test_noisy_documents_are_plausible(world):
    retriever = SimulatedRetriever(SyntheticDocGenerator(world), noise_prob=1.0)
    for fact, docs in zip(world.facts, retriever.search(fact_queries(world), 1), strict=True):
        relation = RELATIONS[fact.relation]
        obj = relation.read(docs[0].text, fact.subject)  # same template, same subject
        assert obj is not None and obj != fact.object
        if relation.object_kind == "year":
            assert re.fullmatch(r"\d{4}", obj)
        else:
            assert obj in world.names(relation.object_kind)  # a real entity of the right kind


def test_unmatched_queries_and_empty_queries(world):
    retriever = SimulatedRetriever(SyntheticDocGenerator(world), noise_prob=0.0)
    docs = retriever.search(["zzqx qqzz", "   ", ""], 2)
    assert [len(d) for d in docs] == [2, 0, 0]
    assert all(judge(world, d) is None for d in docs[0])


# -- determinism ------------------------------------------------------------------------------


def test_seeded_and_independent_of_batching(world):
    queries = fact_queries(world)[:60]
    a = SimulatedRetriever(SyntheticDocGenerator(world), noise_prob=0.5, seed=7)
    b = SimulatedRetriever(SyntheticDocGenerator(world), noise_prob=0.5, seed=7)
    c = SimulatedRetriever(SyntheticDocGenerator(world), noise_prob=0.5, seed=8)
    batched = a.search(queries, 3)
    one_by_one = [b.search([q], 3)[0] for q in reversed(queries)][::-1]
    assert batched == one_by_one
    # 180 draws at p = 0.5: the chance that seed 8 repeats seed 7's pattern is 2**-180.
    assert c.search(queries, 3) != batched


def test_vector_env_shares_one_simulated_retriever_and_matches_singles(world):
    kwargs = {"retriever": "simulated", "retriever_kwargs": {"noise_prob": 0.4}, "max_turns": 2}
    vector = gym.make_vec(SYNTHETIC, num_envs=3, vectorization_mode="vector_entry_point", **kwargs)
    assert len({id(e.retriever) for e in vector.unwrapped.envs}) == 1
    singles = [gym.make(SYNTHETIC, **kwargs) for _ in range(3)]
    obs, _ = vector.reset(seed=4)
    assert obs == tuple(env.reset(seed=4 + i)[0] for i, env in enumerate(singles))
    queries = fact_queries(world)
    done = [False] * 3
    for t in range(5):
        actions = tuple(f"<search>{queries[3 * t + i]}</search>" for i in range(3))
        obs, rewards, terminated, truncated, infos = vector.step(actions)
        for i, env in enumerate(singles):  # next-step autoreset, by hand
            if done[i]:
                expected, _ = env.reset()
                done[i] = False
            else:
                expected, reward, te, tr, info = env.step(actions[i])
                done[i] = te or tr
                assert rewards[i] == reward and infos["retrieved_ids"][i] == info["retrieved_ids"]
            assert obs[i] == expected


# -- prompts and parsing ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "request_",
    [
        DocRequest("who founded x", False, 0, 3),
        DocRequest("a\nquery\n\nResult 1 of 2:\nwith marks inside", True, 4, 5),
        DocRequest("Search query: nested", True, 0, 1),
    ],
)
def test_prompt_round_trip(request_):
    prompt = render_doc_prompt(request_)
    assert read_doc_prompt(prompt) == request_
    assert request_.query in prompt


def test_read_doc_prompt_rejects_other_text():
    assert read_doc_prompt("Tell me a story") is None
    assert read_doc_prompt(render_doc_prompt(DocRequest("q", False))[:-3]) is None
    assert read_doc_prompt(None) is None  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("Title: Peru\nText: Lima is the capital.", ("Peru", "Lima is the capital.")),
        ("**Title:** Peru  \n**Text:** Lima\nis the capital.\n", ("Peru", "Lima is the capital.")),
        ("<think>hmm\nTitle: no</think>title: Peru\ncontent: Lima.", ("Peru", "Lima.")),
        ("Title: Peru\nLima is the capital.", ("Peru", "Lima is the capital.")),
        ("Title: only a title", ("only a title", "")),
        ("random junk ### ))) 12", ("", "random junk ### ))) 12")),
        ("", ("", "")),
        (None, ("", "")),
        (b"\xff\xfe bytes", ("", "\ufffd\ufffd bytes")),
        (42, ("", "42")),
        ("<think>unclosed reasoning", ("", "unclosed reasoning")),
    ],
)
def test_parse_doc_never_raises(completion, expected):
    assert parse_doc(completion) == expected


def test_parse_doc_caps_length():
    title, text = parse_doc("Title: t\nText: " + "word " * 10_000)
    assert title == "t" and len(text) == MAX_DOC_CHARS


# -- generators: callables, policies, failures -------------------------------------------------


class EchoPolicy(Policy):
    """A policy used as a generator: it writes the query back as the document."""

    name = "echo"

    def act(self, observations):
        return [f"Title: Echo\nText: {read_doc_prompt(o).query}" for o in observations]


def test_policy_as_generator_and_docs_per_query():
    retriever = SimulatedRetriever(EchoPolicy(), docs_per_query=2)
    docs = retriever.search(["alpha beta", "gamma"], 5)
    assert [[d.text for d in ds] for ds in docs] == [["alpha beta"] * 2, ["gamma"] * 2]
    assert all(d.id.startswith("sim-") and d.title == "Echo" for ds in docs for d in ds)


@pytest.mark.parametrize(
    "generator, match",
    [
        (lambda prompts: 1 / 0, "ZeroDivisionError"),
        (lambda prompts: ["Title: a\nText: b"], "returned 1 completions"),
        (lambda prompts: "Title: a\nText: b", "list of strings"),
    ],
)
def test_generator_failures_are_retrieval_errors(generator, match):
    retriever = SimulatedRetriever(generator)
    with pytest.raises(RetrievalError, match=match):
        retriever.search(["q"], 2)
    # Through an env: an error observation and info["retrieval_error"], never an exception.
    env = gym.make(SYNTHETIC, retriever="simulated", retriever_kwargs={"generator": generator})
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step("<search>q</search>")
    assert match in info["retrieval_error"] and "search failed" in obs and not terminated


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"generator": 5}, "callable"),
        ({"generator": EchoPolicy(), "noise_prob": 1.5}, "noise_prob"),
        ({"generator": EchoPolicy(), "docs_per_query": 0}, "docs_per_query"),
        ({"generator": EchoPolicy(), "seed": "x"}, "seed"),
        ({}, "needs a document generator"),
        ({"base_url": "http://127.0.0.1:9/v1"}, "needs model="),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(InvalidArgumentError, match=match):
        make_retriever("simulated", **kwargs)


def test_bad_retriever_kwargs():
    with pytest.raises(InvalidArgumentError, match="retriever_kwargs must be a dict"):
        gym.make(SYNTHETIC, retriever_kwargs=["noise_prob"])
    with pytest.raises(InvalidArgumentError, match="only applies to a backend name"):
        gym.make(SYNTHETIC, retriever=SimulatedRetriever(EchoPolicy()), retriever_kwargs={"noise_prob": 0.1})
    with pytest.raises(InvalidArgumentError, match="k must be"):
        SimulatedRetriever(EchoPolicy()).search(["q"], 0)


# -- a local transformers model -----------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A 1-layer Llama with a word-level tokenizer trained here: its output is junk text."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    folder = tmp_path_factory.mktemp("tiny-llama")
    model = tokenizers.models.WordLevel(unk_token="[UNK]")
    tok = tokenizers.Tokenizer(model)
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    trainer = tokenizers.trainers.WordLevelTrainer(special_tokens=["[UNK]", "[PAD]", "[EOS]"])
    corpus = [
        render_doc_prompt(DocRequest(q, n, 0, 2))
        for q in ("who founded it", "capital of peru")
        for n in (0, 1)
    ]
    corpus += ["Title: Peru Text: Lima is the capital city of Peru .", "<think> junk </think> ### ***"]
    tok.train_from_iterator(corpus, trainer)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", eos_token="[EOS]"
    )
    fast.save_pretrained(folder)
    config = transformers.LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        pad_token_id=fast.pad_token_id,
        eos_token_id=fast.eos_token_id,
        bos_token_id=fast.eos_token_id,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def test_transformers_generator_junk_becomes_documents(tiny_model):
    generator = transformers_generator(tiny_model, max_new_tokens=6)
    retriever = SimulatedRetriever(generator, noise_prob=0.5, seed=1)
    docs = retriever.search(["who founded Rode Labs", "capital of peru", ""], 2)
    assert [len(d) for d in docs] == [2, 2, 0]
    assert all(isinstance(d, Doc) and isinstance(d.text, str) for ds in docs for d in ds)
    assert retriever.search(["who founded Rode Labs"], 2)[0] == docs[0]  # greedy: deterministic


def test_transformers_model_through_an_env(tiny_model):
    env = gym.make(
        SYNTHETIC, retriever="simulated", retriever_kwargs={"model": str(tiny_model), "max_new_tokens": 4}
    )
    env.reset(seed=0)
    obs, _, _, _, info = env.step("<search>capital of peru</search>")
    assert "retrieval_error" not in info and obs.count("Doc ") == 3 and len(info["retrieved_ids"][0]) == 3


def test_transformers_bad_model_path(tmp_path):
    retriever = SimulatedRetriever(transformers_generator(tmp_path, max_new_tokens=2))
    with pytest.raises(RetrievalError, match="Cannot load"):
        retriever.search(["q"], 1)


# -- an OpenAI-compatible endpoint ------------------------------------------------------------------


class ChatServer(ThreadingHTTPServer):
    """A stand-in for a vLLM server: POST /v1/chat/completions, with scripted faults."""

    def __init__(self, mode: str):
        super().__init__(("127.0.0.1", 0), ChatHandler)
        self.mode, self.bodies, self.headers_seen, self.lock = mode, [], [], threading.Lock()


class ChatHandler(BaseHTTPRequestHandler):
    server: ChatServer

    def log_message(self, *args):  # keep pytest output clean
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.server.lock:
            self.server.bodies.append(body)
            self.server.headers_seen.append(dict(self.headers))
            count = len(self.server.bodies)
        mode = self.server.mode
        if self.path != "/v1/chat/completions" or mode == "bad_request":
            return self._send(400, b'{"error": "bad request"}')
        if mode == "garbage":
            return self._send(200, b"<html>not json")
        if mode == "flaky" and count % 2 == 1:
            return self._send(503, b'{"error": "overloaded"}')
        message = body["messages"][0]["content"]
        request = read_doc_prompt(message)
        if request is None:
            content = f"Title: Plain\nText: {message}"
        else:
            content = f"Title: {'Noise' if request.noisy else 'Echo'}\nText: {request.query} #{request.slot}"
        answer = {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}
        self._send(200, json.dumps(answer).encode())

    def _send(self, status: int, payload: bytes):
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


@pytest.fixture
def chat_server(request):
    server = ChatServer(request.param)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join()


def _url(server: ChatServer) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}/v1"


@pytest.mark.parametrize("chat_server", ["ok"], indirect=True)
def test_openai_generator_round_trip(chat_server, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    generator = openai_generator("sim-model", _url(chat_server), timeout=5, retries=0)
    retriever = SimulatedRetriever(generator, noise_prob=0.5, seed=3)
    queries = ["who founded Rode Labs", "capital of peru"]
    docs = retriever.search(queries, 3)
    for query, ds in zip(queries, docs, strict=True):
        assert [d.text for d in ds] == [f"{query} #{j}" for j in range(3)]
        assert [d.title == "Noise" for d in ds] == [retriever.is_noisy(query, j) for j in range(3)]
    assert len(chat_server.bodies) == 6
    assert all(b["model"] == "sim-model" and b["messages"][0]["role"] == "user" for b in chat_server.bodies)
    assert all("Authorization" not in h for h in chat_server.headers_seen)
    openai_generator("sim-model", _url(chat_server), api_key="k1")(["x"])
    assert chat_server.headers_seen[-1]["Authorization"] == "Bearer k1"


@pytest.mark.parametrize("chat_server", ["flaky"], indirect=True)
def test_openai_generator_retries(chat_server):
    generator = openai_generator("m", _url(chat_server), timeout=5, retries=1, backoff=0.01, concurrency=1)
    prompts = [render_doc_prompt(DocRequest(q, False, 0, 1)) for q in ("one", "two")]
    assert generator(prompts) == ["Title: Echo\nText: one #0", "Title: Echo\nText: two #0"]
    # One at a time: each prompt's first request gets a 503 and its retry succeeds.
    assert len(chat_server.bodies) == 4


@pytest.mark.parametrize("chat_server", ["garbage", "bad_request"], indirect=True)
def test_openai_generator_failures(chat_server):
    generator = openai_generator("m", _url(chat_server), timeout=5, retries=2, backoff=0.01)
    with pytest.raises(RetrievalError, match="chat endpoint"):
        generator(["x"])
    # Garbage is retried (1 + 2 attempts); a 400 says the request itself is wrong: no retry.
    assert len(chat_server.bodies) == (3 if chat_server.mode == "garbage" else 1)
    env = gym.make(SYNTHETIC, retriever="simulated", retriever_kwargs={"generator": generator})
    env.reset(seed=0)
    _, _, _, _, info = env.step("<search>q</search>")
    assert "chat endpoint" in info["retrieval_error"]


def test_openai_generator_server_down():
    server = ChatServer("ok")
    url = _url(server)
    server.server_close()  # nothing listens on that port any more
    generator = openai_generator("m", url, timeout=2, retries=1, backoff=0.01)
    with pytest.raises(RetrievalError, match="chat endpoint"):
        generator(["x"])
    with pytest.raises(InvalidArgumentError, match="base_url"):
        openai_generator("m", "127.0.0.1:8000")


def test_import_searchgym_stays_light():
    import subprocess
    import sys

    code = "import searchgym, sys; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    assert "simulated" in searchgym.retrieval.RETRIEVERS
