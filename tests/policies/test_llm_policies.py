"""The language-model policies: HFPolicy on a tiny offline model, OpenAIPolicy against a
loopback chat-completions server, VLLMPolicy up to vLLM's boundary, make_policy specs, and
``searchgym eval --policy hf:PATH`` end to end."""

from __future__ import annotations

import json
import math
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import gymnasium as gym
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import searchgym  # noqa: F401,E402  (registers the ids)
from searchgym.cli import main  # noqa: E402
from searchgym.error import InvalidArgumentError, SearchGymError, UnknownNameError  # noqa: E402
from searchgym.policies import (  # noqa: E402
    ChatFormatter,
    EndpointError,
    HFPolicy,
    OpenAIPolicy,
    VLLMPolicy,
    evaluate,
    make_policy,
)
from searchgym.policies.openai_policy import restore_stop  # noqa: E402
from searchgym.policies.tiny import build_tiny_lm, load_tiny_lm  # noqa: E402

ENV_ID = "searchgym/SyntheticFacts-v1"


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return build_tiny_lm(tmp_path_factory.mktemp("tiny"), hidden_size=64, num_layers=2)


@pytest.fixture(scope="module")
def tiny(tiny_path):
    return load_tiny_lm(tiny_path)


def make_env(protocol: str = "search_r1") -> Callable[[], gym.Env]:
    return lambda: gym.make(ENV_ID, protocol=protocol)


def prompts(n: int, protocol: str = "search_r1") -> list[str]:
    env = make_env(protocol)()
    out = [env.reset(options={"index": i})[0] for i in range(n)]
    env.close()
    return out


# -- the tiny model ---------------------------------------------------------------------------


def test_build_tiny_lm_caches_by_arguments(tmp_path):
    texts = ["Where was Ada Lovelace born?", "<search>capital of Peru</search>"] * 5
    first = build_tiny_lm(tmp_path, texts=texts, vocab_size=300, hidden_size=32, num_layers=1)
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_lm(tmp_path, texts=texts, vocab_size=300, hidden_size=32, num_layers=1) == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp  # reused, not rebuilt
    other = build_tiny_lm(tmp_path, texts=texts, vocab_size=300, hidden_size=32, num_layers=1, seed=1)
    assert other != first
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == sorted(
        [first.name, other.name]
    )  # no staging left
    with pytest.raises(InvalidArgumentError, match="hidden_size must be a multiple of 32, got 48"):
        build_tiny_lm(tmp_path, hidden_size=48)
    with pytest.raises(InvalidArgumentError, match="texts is empty"):
        build_tiny_lm(tmp_path, texts=["", "  "])


def test_load_tiny_lm_gives_the_saved_sizes_and_a_fast_tokenizer(tiny):
    from transformers import PreTrainedTokenizerFast

    model, tok = tiny
    assert isinstance(tok, PreTrainedTokenizerFast)
    assert (model.config.hidden_size, model.config.num_hidden_layers) == (64, 2)
    assert model.config.vocab_size == len(tok) == 1000
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert tok.chat_template and model.generation_config.eos_token_id == tok.eos_token_id


# -- HFPolicy ---------------------------------------------------------------------------------


class RecordingHF(HFPolicy):
    """HFPolicy that keeps every model input it generated from."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.inputs: list[list[str]] = []

    def complete(self, texts):
        self.inputs.append(list(texts))
        return super().complete(texts)


@pytest.mark.parametrize("protocol", ["search_r1", "tool_call"])
def test_hf_policy_runs_synthetic_episodes_through_evaluate(tiny_path, protocol):
    policy = RecordingHF(str(tiny_path), protocol=protocol, max_new_tokens=24, batch_size=3)
    result = evaluate(make_env(protocol), policy, 4, batch_size=4, progress=False)
    assert result.episodes == 4
    assert 0.0 <= result.format_ok <= 1.0 and math.isfinite(result.reward)
    assert result.policy == f"hf:{tiny_path}"
    # four contexts in the first round; an untrained model rarely ends an episode early
    assert len(policy.inputs[0]) == 4 and len(policy.inputs) >= 2
    # a later turn's model input is an earlier input + the action + the chat-formatted observation
    for after in policy.inputs[1]:
        before = [b for b in policy.inputs[0] if after.startswith(b)]
        assert len(before) == 1 and after.endswith("<|im_end|>\n<|im_start|>assistant\n")
        assert after.count("<|im_start|>assistant\n") == 2 and after.count("<|im_start|>user\n") == 2


def test_hf_policy_first_inputs_are_the_formatted_prompts(tiny_path):
    policy = RecordingHF(str(tiny_path), max_new_tokens=4)
    contexts = prompts(2)
    policy.act(contexts)
    assert policy.inputs == [[ChatFormatter(policy.tokenizer).prompt(c) for c in contexts]]


def test_stop_strings_cut_generation(tiny):
    model, tok = tiny
    text = ChatFormatter(tok).prompt(prompts(1)[0])
    free = HFPolicy(model, tokenizer=tok, stop_strings=[], max_new_tokens=40).complete([text])[0]
    assert free.finish in ("length", "eos") and len(free.text) > 20
    # pick a stop string from the middle of what the model writes when nothing stops it;
    # greedy decoding then writes the same text up to its first occurrence, and stops there
    stop = free.text[len(free.text) // 2 : len(free.text) // 2 + 3]
    expected = free.text[: free.text.find(stop) + len(stop)]
    cut = HFPolicy(model, tokenizer=tok, stop_strings=[stop], max_new_tokens=40).complete([text])[0]
    assert cut.finish == "stop"
    assert cut.text == expected and len(cut.text) < len(free.text)
    assert cut.completion_ids == free.completion_ids[: len(cut.completion_ids)]
    # the kept tokens are the shortest prefix whose text holds the stop string
    assert stop in tok.decode(cut.completion_ids) and stop not in tok.decode(cut.completion_ids[:-1])


def test_a_batch_of_contexts_comes_back_in_order(tiny):
    model, tok = tiny
    contexts = prompts(3)
    batched = HFPolicy(model, tokenizer=tok, max_new_tokens=12, batch_size=3).act(contexts)
    alone = [HFPolicy(model, tokenizer=tok, max_new_tokens=12).act([c])[0] for c in contexts]
    assert len(set(alone)) == 3  # distinct, so a reordering would show
    assert batched == alone
    # batch_size 2 splits the three into two generate calls, same answers
    assert HFPolicy(model, tokenizer=tok, max_new_tokens=12, batch_size=2).act(contexts) == alone


def test_sampling_is_seeded(tiny):
    model, tok = tiny
    contexts = prompts(2)

    def run(seed: int) -> list[str]:
        return HFPolicy(model, tokenizer=tok, max_new_tokens=16, temperature=1.0, seed=seed).act(contexts)

    assert run(3) == run(3)
    assert run(3) != run(4)


def test_a_context_beyond_the_window_gets_an_empty_action(tiny, caplog):
    model, tok = tiny
    policy = HFPolicy(model, tokenizer=tok, max_new_tokens=8, max_context_tokens=64)
    short = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    completions = policy.complete([prompts(1)[0], short])
    assert completions[0].text == "" and completions[0].finish == "overflow"
    assert completions[1].finish != "overflow" and completions[1].completion_ids
    assert "leaves no room" in caplog.text


def test_hf_policy_bad_input(tiny, tmp_path):
    model, tok = tiny
    with pytest.raises(InvalidArgumentError, match="no config.json"):
        HFPolicy(str(tmp_path))
    with pytest.raises(InvalidArgumentError, match="tokenizer"):
        HFPolicy(model)
    with pytest.raises(InvalidArgumentError, match="max_new_tokens must be an int >= 1, got 0"):
        HFPolicy(model, tokenizer=tok, max_new_tokens=0)
    with pytest.raises(InvalidArgumentError, match="list of context strings"):
        HFPolicy(model, tokenizer=tok).act("a single string")


# -- OpenAIPolicy against a loopback server -----------------------------------------------------


class ChatServer:
    """A chat-completions server on 127.0.0.1 whose replies come from ``reply(body)``.

    ``reply`` returns ``(status, payload)``: a dict is sent as JSON, bytes as they are;
    a ``("sleep", seconds)`` status sleeps before answering the next scripted way.
    """

    def __init__(self, reply: Callable[[dict[str, Any]], tuple[Any, Any]]):
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    server.requests.append({"path": self.path, **body})
                status, payload = reply(body)
                if status == "sleep":
                    time.sleep(payload)
                    status, payload = 200, completion("late")
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the client gave up waiting
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


@pytest.fixture()
def serve() -> Iterator[Callable[..., ChatServer]]:
    servers: list[ChatServer] = []

    def start(reply: Callable[[dict[str, Any]], tuple[Any, Any]]) -> ChatServer:
        servers.append(ChatServer(reply))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def completion(content: Any, **choice: Any) -> dict[str, Any]:
    return {
        "id": "x",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, **choice}],
    }


def scripted_model(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """Search once for the question, then answer 'unknown'; the server cuts the stop strings."""
    messages = [m for m in body["messages"] if m["role"] != "system"]
    if len(messages) == 1:
        question = messages[0]["content"].rsplit("Question: ", 1)[1]
        # vLLM names the stop string that fired
        return 200, completion(f"<think>Look it up.</think>\n<search>{question}", finish_reason="stop",
                               stop_reason="</search>")  # fmt: skip
    # a plain OpenAI server says only finish_reason="stop"
    return 200, completion("<think>Done.</think>\n<answer>unknown", finish_reason="stop")


def test_openai_policy_runs_episodes_against_a_loopback_server(serve):
    server = serve(scripted_model)
    policy = OpenAIPolicy("tiny", server.url, max_new_tokens=32, timeout=10)
    result = evaluate(make_env(), policy, 6, batch_size=3, progress=False)
    # every episode: one search, then a well-formed answer
    assert (result.episodes, result.st, result.format_ok) == (6, 1.0, 1.0)
    assert len(server.requests) == 12
    first = server.requests[0]
    assert first["path"] == "/v1/chat/completions"
    assert (first["model"], first["max_tokens"], first["stop"]) == ("tiny", 32, ["</search>", "</answer>"])
    # the second request carries the whole conversation as chat turns
    second = next(r for r in server.requests if len(r["messages"]) == 3)
    user, assistant, observation = second["messages"]
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "user"]
    assert assistant["content"].endswith("</search>")  # restored from stop_reason
    assert observation["content"].startswith("<information>") and observation["content"].endswith(
        "</information>"
    )
    assert user["content"].startswith("Answer the question") and not user["content"].endswith("\n")


def test_openai_policy_matches_the_chat_formatter_turns(serve):
    server = serve(scripted_model)
    policy = OpenAIPolicy("m", server.url, system="Be brief.")
    env = make_env()()
    context, _ = env.reset(options={"index": 0})
    action = policy.act([context])[0]
    observation, *_ = env.step(action)
    assert action.endswith("</search>") and "<information>" in observation
    policy.act([context + action + observation])
    expected = ChatFormatter(None, system="Be brief.").messages([context, action, observation])
    assert server.requests[-1]["messages"] == expected


def test_a_timeout_is_retried(serve):
    calls = []

    def slow_then_fast(body):
        calls.append(1)
        return (
            ("sleep", 2.0)
            if len(calls) == 1
            else (200, completion("<answer>x</answer>", finish_reason="stop"))
        )

    server = serve(slow_then_fast)
    policy = OpenAIPolicy("m", server.url, timeout=0.3, retries=1, backoff=0)
    assert policy.act(["Question: q\n"]) == ["<answer>x</answer>"]
    assert len(server.requests) == 2


def test_a_server_that_never_answers_in_time_fails_with_a_clear_error(serve):
    server = serve(lambda body: ("sleep", 2.0))
    policy = OpenAIPolicy("m", server.url, timeout=0.2, retries=1, backoff=0)
    with pytest.raises(EndpointError, match=r"failed 2 time\(s\); last: no answer within 0.2 s"):
        policy.act(["Question: q\n"])


def test_garbage_is_retried_then_reported(serve):
    server = serve(lambda body: (200, b"<html>not json</html>"))
    policy = OpenAIPolicy("m", server.url, retries=2, backoff=0)
    with pytest.raises(EndpointError, match="not a chat completion.*not json"):
        policy.act(["q"])
    assert len(server.requests) == 3
    wrong_shape = serve(lambda body: (200, {"choices": []}))
    with pytest.raises(EndpointError, match="IndexError"):
        OpenAIPolicy("m", wrong_shape.url, retries=0).act(["q"])


def test_server_errors_are_retried_and_client_errors_are_not(serve):
    calls = []

    def flaky(body):
        calls.append(1)
        return (503, {"error": "busy"}) if len(calls) < 3 else (200, completion("<answer>ok</answer>"))

    assert OpenAIPolicy("m", serve(flaky).url, retries=2, backoff=0).act(["q"]) == ["<answer>ok</answer>"]
    refusing = serve(lambda body: (400, {"error": "context too long"}))
    with pytest.raises(EndpointError, match="HTTP 400.*context too long"):
        OpenAIPolicy("m", refusing.url, retries=3, backoff=0).act(["q"])
    assert len(refusing.requests) == 1  # not retried


def test_on_error_empty_keeps_the_evaluation_going(serve):
    server = serve(lambda body: (400, {"error": "no"}))
    policy = OpenAIPolicy("m", server.url, retries=0, on_error="empty")
    result = evaluate(make_env(), policy, 2, batch_size=2, progress=False)
    assert result.episodes == 2 and result.format_ok == 0.0  # empty actions are format errors


def test_a_closed_port_is_an_endpoint_error():
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(EndpointError, match="failed 1 time"):
        OpenAIPolicy("m", f"http://127.0.0.1:{port}/v1", retries=0).act(["q"])


def test_the_batch_comes_back_in_order_under_concurrency(serve):
    def echo(body):
        text = body["messages"][-1]["content"]
        time.sleep(0.05 * (int(text) % 3))  # later contexts may finish first
        return 200, completion(f"<answer>{text}</answer>")

    server = serve(echo)
    actions = OpenAIPolicy("m", server.url, max_concurrency=4).act([str(i) for i in range(8)])
    assert actions == [f"<answer>{i}</answer>" for i in range(8)]


def test_restore_stop_cases():
    stops = ["</search>", "</answer>"]
    assert restore_stop("<search>q", {"stop_reason": "</search>"}, stops) == "<search>q</search>"
    assert (
        restore_stop("<answer>a", {"stop_reason": None, "finish_reason": "stop"}, stops) == "<answer>a"
    )  # EOS
    assert restore_stop("<answer>a", {"stop_reason": 151645}, stops) == "<answer>a"  # a stop token id
    assert restore_stop("<search>q</search>", {"stop_reason": "</search>"}, stops) == "<search>q</search>"
    # no stop_reason field: close the latest open tag
    assert restore_stop("<answer>x</answer> <search>q", {"finish_reason": "stop"}, stops) == (
        "<answer>x</answer> <search>q</search>"
    )
    assert restore_stop("no tags", {"finish_reason": "stop"}, stops) == "no tags"
    assert restore_stop("<search>q", {"finish_reason": "length"}, stops) == "<search>q"


def test_openai_policy_bad_arguments():
    with pytest.raises(InvalidArgumentError, match="http"):
        OpenAIPolicy("m", "127.0.0.1:8000")
    with pytest.raises(InvalidArgumentError, match="timeout must be a finite number > 0, got 0"):
        OpenAIPolicy("m", "http://127.0.0.1:1/v1", timeout=0)
    with pytest.raises(InvalidArgumentError, match="on_error"):
        OpenAIPolicy("m", "http://127.0.0.1:1/v1", on_error="ignore")


# -- VLLMPolicy up to vLLM's boundary -----------------------------------------------------------


def test_vllm_policy_without_vllm_says_how_to_install_it(monkeypatch, tiny_path):
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` fail, installed or not
    with pytest.raises(SearchGymError, match="pip install vllm") as caught:
        VLLMPolicy(str(tiny_path))
    assert "hf:PATH" in str(caught.value)
    with pytest.raises(SearchGymError, match="pip install vllm"):
        make_policy(f"vllm:{tiny_path}")


def test_vllm_policy_drives_the_engine_with_token_ids_and_stop_strings(monkeypatch, tiny):
    _, tok = tiny
    seen: dict[str, Any] = {}

    class SamplingParams:
        def __init__(self, **kwargs: Any):
            self.kwargs = kwargs

    class LLM:
        def __init__(self, **kwargs: Any):
            seen["engine"] = kwargs

        def get_tokenizer(self):
            return tok

        def generate(self, prompts, params, use_tqdm=True):
            seen.setdefault("prompts", []).append(prompts)
            seen["params"] = params.kwargs
            outputs = []
            for i, _ in enumerate(prompts):
                text = f"<think>t</think><answer>a{i}</answer>"
                outputs.append(types.SimpleNamespace(outputs=[types.SimpleNamespace(text=text)]))
            return outputs

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM, SamplingParams=SamplingParams))
    policy = make_policy("vllm:/models/qwen?max_new_tokens=64&tensor_parallel_size=2", protocol="tool_call")
    contexts = prompts(3, "tool_call")
    assert policy.act(contexts) == [f"<think>t</think><answer>a{i}</answer>" for i in range(3)]
    assert seen["engine"]["model"] == "/models/qwen" and seen["engine"]["tensor_parallel_size"] == 2
    params = seen["params"]
    assert params["stop"] == ["</answer>", "</tool_call>"] and params["include_stop_str_in_output"] is True
    assert params["max_tokens"] == 64
    formatter = ChatFormatter(tok)
    assert seen["prompts"][0] == [
        {"prompt_token_ids": tok(formatter.prompt(c), add_special_tokens=False)["input_ids"]}
        for c in contexts
    ]


def _fake_vllm(tok: Any) -> types.SimpleNamespace:
    class LLM:
        def __init__(self, **kwargs: Any):
            pass

        def get_tokenizer(self):
            return tok

    return types.SimpleNamespace(LLM=LLM, SamplingParams=dict)


STOP_ARGUMENTS: list[tuple[str, Callable[[], Any]]] = [
    ("default", lambda: None),
    ("list", lambda: ["</x>", "</y>"]),
    ("tuple", lambda: ("</x>",)),
    ("generator", lambda: (s for s in ["</x>", "</y>"])),
    ("none", lambda: []),
    ("bare string", lambda: "</x>"),
    ("empty string", lambda: ["</x>", ""]),
    ("number", lambda: 3),
]


@pytest.mark.parametrize("make_value", [v for _, v in STOP_ARGUMENTS], ids=[k for k, _ in STOP_ARGUMENTS])
def test_the_three_llm_policies_read_stop_strings_alike(monkeypatch, tiny, make_value):
    model, tok = tiny
    monkeypatch.setitem(sys.modules, "vllm", _fake_vllm(tok))
    builders = {
        "hf": lambda v: HFPolicy(model, tokenizer=tok, protocol="tool_call", stop_strings=v),
        "openai": lambda v: OpenAIPolicy("m", "http://127.0.0.1:1/v1", protocol="tool_call", stop_strings=v),
        "vllm": lambda v: VLLMPolicy("/models/m", protocol="tool_call", stop_strings=v),
    }
    outcomes = {}
    for name, build in builders.items():
        try:
            outcomes[name] = build(make_value()).stop_strings
        except InvalidArgumentError as exc:
            outcomes[name] = str(exc)
    assert outcomes["hf"] == outcomes["openai"] == outcomes["vllm"], outcomes
    value = make_value()
    if value is None:
        assert outcomes["hf"] == ["</answer>", "</tool_call>"]  # tool_call's own closing tags
    elif isinstance(value, str) or value == 3 or (isinstance(value, list) and "" in value):
        assert isinstance(outcomes["hf"], str) and "must be a list of non-empty strings" in outcomes["hf"]
    else:
        assert outcomes["hf"] == list(make_value())


# -- make_policy specs and the CLI --------------------------------------------------------------


def test_make_policy_reads_specs_and_options(tiny_path):
    policy = make_policy(f"hf:{tiny_path}?max_new_tokens=7&temperature=0.5&system=Be brief.", protocol="sem")
    assert isinstance(policy, HFPolicy)
    assert (policy.max_new_tokens, policy.temperature, policy.formatter.system) == (7, 0.5, "Be brief.")
    assert policy.stop_strings == ["</search>"] and policy.name == f"hf:{tiny_path}"
    remote = make_policy("openai:Qwen/Qwen2.5-7B-Instruct@http://127.0.0.1:8000/v1?timeout=5")
    assert isinstance(remote, OpenAIPolicy)
    assert (remote.model, remote.base_url, remote.timeout) == (
        "Qwen/Qwen2.5-7B-Instruct",
        "http://127.0.0.1:8000/v1",
        5.0,
    )
    assert make_policy("openai:m@http://h:1/v1", max_new_tokens=9).max_new_tokens == 9


def test_make_policy_bad_specs(tiny_path):
    with pytest.raises(InvalidArgumentError, match="takes no option 'max_tokens'.*max_new_tokens"):
        make_policy(f"hf:{tiny_path}?max_tokens=7")
    with pytest.raises(InvalidArgumentError, match="not key=value"):
        make_policy(f"hf:{tiny_path}?max_new_tokens")
    with pytest.raises(InvalidArgumentError, match="openai:MODEL@URL"):
        make_policy("openai:gpt-4o")
    with pytest.raises(InvalidArgumentError, match="give the model folder"):
        make_policy("hf:")
    with pytest.raises(UnknownNameError, match="hf:PATH"):
        make_policy("hff:/x")
    with pytest.raises(InvalidArgumentError, match="only apply to language-model policies"):
        make_policy("direct", max_new_tokens=3)


def test_searchgym_eval_with_an_hf_policy_end_to_end(tiny_path, tmp_path, capsys):
    out = tmp_path / "hf.json"
    spec = f"hf:{tiny_path}?max_new_tokens=16"
    argv = [
        "eval",
        "--policy",
        spec,
        "--episodes",
        "4",
        "--batch-size",
        "4",
        "--no-progress",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    payload = json.loads(out.read_text(encoding="utf-8"))
    assert payload["policy"] == f"hf:{tiny_path}" and payload["episodes"] == 4
    assert payload["em"] == 0.0 and 0.0 <= payload["format_ok"] <= 1.0  # an untrained model's junk
    assert f"| hf:{tiny_path} | all | 4 |" in capsys.readouterr().out


def test_sampling_ignores_the_model_configs_top_k(tiny_path):
    """Sampled evaluation draws from the whole distribution, as the trainer does, even when the
    model's generation_config carries a top_k (SmolLM2's says 50; here 1, which would make
    sampling greedy)."""
    model, tok = load_tiny_lm(tiny_path)
    model.generation_config.top_k = 1
    contexts = prompts(4)
    greedy = HFPolicy(model, tokenizer=tok, max_new_tokens=16).act(contexts)
    sampled = HFPolicy(model, tokenizer=tok, max_new_tokens=16, temperature=3.0, seed=1).act(contexts)
    assert sampled != greedy
    top1 = HFPolicy(model, tokenizer=tok, max_new_tokens=16, temperature=3.0, seed=1, top_k=1).act(contexts)
    assert top1 == greedy
