"""The OpenAI-shaped server (reference/engine/server.py), driven by the official `openai` client.

A module-wide server runs the engine on the tiny model in a background thread (uvicorn on
127.0.0.1, a free port). Texts are compared with single-sequence greedy decoding
(reference.decoding.generate) on the same model.
"""
import json
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest
import uvicorn

from reference.decoding import generate
from reference.engine import LLM
from reference.engine.openai_api import chat_prompt
from reference.engine.server import build_app
from reference.model import load_model

MODEL = "tiny"


class BackgroundServer:
    """uvicorn serving `app` from a thread, on a socket bound before it starts."""

    def __init__(self, app):
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.url = "http://127.0.0.1:%d" % self.socket.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]})

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.05)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=30)
        assert not self.thread.is_alive(), "the server did not shut down"


BLOCK_SIZE, NUM_BLOCKS = 16, 28   # a K/V pool of 448 tokens, below the 512-token context


@pytest.fixture(scope="module")
def llm():
    return LLM(model=MODEL, max_num_seqs=16, block_size=BLOCK_SIZE, num_blocks=NUM_BLOCKS)


@pytest.fixture(scope="module")
def server(llm):
    with BackgroundServer(build_app(llm, MODEL)) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def reference_model():
    return load_model(MODEL)


def greedy_text(reference_model, prompt_ids, n):
    model, tok = reference_model
    return tok.decode(generate(model, prompt_ids, n, stop_ids=tok.stop_ids))


def test_models_list_names_the_served_model(client):
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_greedy_completion_equals_single_sequence_decoding(client, reference_model):
    tok = reference_model[1]
    prompt = "The key-value cache"
    expected = greedy_text(reference_model, tok.encode(prompt), 12)
    reply = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
    assert (reply.choices[0].text, reply.choices[0].finish_reason) == (expected, "length")
    n_prompt = len(tok.encode(prompt))
    assert reply.usage.model_dump(exclude_none=True) == {
        "prompt_tokens": n_prompt, "completion_tokens": 12, "total_tokens": n_prompt + 12}
    by_ids = client.completions.create(model=MODEL, prompt=tok.encode(prompt), max_tokens=12,
                                       temperature=0)
    assert by_ids.choices[0].text == expected


def test_streamed_deltas_add_up_to_the_plain_text(client):
    kwargs = dict(model=MODEL, prompt="Paged attention", max_tokens=20, temperature=0)
    whole = client.completions.create(**kwargs)
    chunks = list(client.completions.create(**kwargs, stream=True,
                                            stream_options={"include_usage": True}))
    text_chunks = [c for c in chunks if c.choices]
    assert len(text_chunks) > 1, "the text came in one piece: nothing was streamed"
    assert "".join(c.choices[0].text for c in text_chunks) == whole.choices[0].text
    assert text_chunks[-1].choices[0].finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == 20
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_stop_string_cuts_the_text_plain_and_streamed(client, reference_model):
    tok = reference_model[1]
    prompt = "Stop strings"
    full = greedy_text(reference_model, tok.encode(prompt), 30)
    stop = next(full[i:i + 2] for i in range(4, len(full) - 1)
                if full[i:i + 2].isascii() and full[i:i + 2].isprintable())
    kwargs = dict(model=MODEL, prompt=prompt, max_tokens=30, temperature=0, stop=[stop])
    reply = client.completions.create(**kwargs)
    assert reply.choices[0].text == full[:full.index(stop)]
    assert reply.choices[0].finish_reason == "stop"
    chunks = list(client.completions.create(**kwargs, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == reply.choices[0].text, (
        "the stream showed part of the stop string before the engine cut it")
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_sampling_fields_reach_the_engine(client, reference_model):
    tok = reference_model[1]
    prompt = "Sampling"
    kwargs = dict(model=MODEL, prompt=prompt, max_tokens=16, temperature=1.0)

    def text(**extra):
        return client.completions.create(**kwargs, **extra).choices[0].text

    assert text(extra_body={"top_k": 1}) == greedy_text(reference_model, tok.encode(prompt), 16)
    assert text(seed=7) == text(seed=7), "the same seed gave different samples"
    assert text(seed=7) != text(seed=8)


def test_chat_completion_plain_and_streamed(client, reference_model):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    ids = chat_prompt(reference_model[1], messages)
    reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10,
                                           temperature=0)
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content == greedy_text(reference_model, ids, 10)
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (len(ids), 10)
    assert reply.usage.total_tokens == len(ids) + 10
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10,
                                                 temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == reply.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "length"


def test_concurrent_requests_join_one_batch(client, llm, reference_model):
    tok = reference_model[1]
    prompts = [f"Request number {i} asks" for i in range(8)]
    n = 24
    replies, start = [None] * len(prompts), threading.Barrier(len(prompts))

    def ask(i):
        start.wait()
        replies[i] = client.completions.create(model=MODEL, prompt=prompts[i], max_tokens=n,
                                               temperature=0)

    steps_before = llm.engine.stats["steps"]
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    steps = llm.engine.stats["steps"] - steps_before
    assert all(r is not None for r in replies), "a concurrent request did not complete"
    for prompt, reply in zip(prompts, replies):
        assert reply.choices[0].text == greedy_text(reference_model, tok.encode(prompt), n)
    total = sum(r.usage.completion_tokens for r in replies)
    assert total == n * len(prompts)
    assert steps < total / 2, (f"{steps} engine steps for {total} tokens: the requests ran one "
                               f"after another instead of sharing steps")


@pytest.mark.parametrize("kwargs, message", [
    (dict(prompt="x" * 600, max_tokens=4), "prompt has 600 tokens; the context window is 512"),
    (dict(prompt="x" * 450, max_tokens=4), "prompt has 450 tokens; the whole K/V pool holds 448"),
    (dict(prompt="hi", max_tokens=0), "max_tokens must be >= 1, got 0"),
    (dict(prompt="hi", max_tokens="many"), "max_tokens: Input should be a valid integer"),
    (dict(prompt=[104, 1.5]), "prompt: should be str or list[int], got [104, 1.5]"),
    (dict(prompt=[104, 300]), "token id 300 is outside the vocabulary (size 256)"),
    (dict(prompt="hi", n=2), "n=2 is not supported"),
    (dict(prompt="hi", temperature=-1), "temperature must be a finite number >= 0"),
    (dict(prompt="hi", model="gpt-4"), "the model 'gpt-4' does not exist"),
])
def test_bad_request_is_400_while_a_good_request_completes(client, kwargs, message):
    good: dict = {}
    worker = threading.Thread(target=lambda: good.update(reply=client.completions.create(
        model=MODEL, prompt="A good request", max_tokens=40, temperature=0)))
    worker.start()
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(**{"model": MODEL, **kwargs})
    worker.join(timeout=60)
    assert caught.value.status_code == 400
    assert message in caught.value.body["message"], caught.value.body
    assert good["reply"].usage.completion_tokens == 40


@pytest.mark.parametrize("method, route, body, status, message", [
    ("GET", "/v1/engines", None, 404, "no route GET /v1/engines"),
    ("DELETE", "/v1/completions", None, 405, "DELETE is not allowed on /v1/completions"),
    ("POST", "/v1/completions", '{"model": "tiny", prompt', 400, "the body is not valid JSON"),
    ("POST", "/v1/chat/completions", '{"model": "tiny", "messages": [{"role": "bot"}]}', 400,
     "messages.0.role: Input should be 'system', 'user' or 'assistant'"),
])
def test_http_errors_in_the_openai_shape(server, method, route, body, status, message):
    response = httpx.request(method, server.url + route, content=body,
                             headers={"Content-Type": "application/json"})
    assert response.status_code == status
    error = response.json()["error"]
    assert message in error["message"], error
    assert set(error) == {"message", "type", "param", "code"}


def test_a_short_request_does_not_wait_for_a_long_one(client, llm):
    kwargs = dict(model=MODEL, temperature=0, stream=True)
    long = client.completions.create(prompt="A long request", max_tokens=400, **kwargs)
    next(iter(long))                      # the long request is decoding
    short = client.completions.create(prompt="A short one", max_tokens=4, **kwargs)
    assert list(short)[-1].choices[0].finish_reason == "length"
    assert llm.engine.has_unfinished(), "the short request was served after the long one finished"
    assert list(long)[-1].choices[0].finish_reason == "length"


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_disconnects_has_its_request_aborted(server, llm, stream):
    steps_before = llm.engine.stats["steps"]
    body = {"model": MODEL, "prompt": "Never read to the end", "max_tokens": 400, "stream": stream}
    if stream:
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as response:
            next(response.iter_lines())   # the first chunk: the request is decoding
    else:   # a plain request sent by hand, its connection closed once the engine runs it
        payload = json.dumps(body).encode()
        host, port = server.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as connection:
            connection.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                               b"application/json\r\nContent-Length: %d\r\n\r\n%s"
                               % (len(payload), payload))
            while llm.engine.stats["steps"] == steps_before:
                time.sleep(0.001)
    deadline = time.monotonic() + 10
    while llm.engine.has_unfinished() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not llm.engine.has_unfinished(), "the request kept decoding after its client left"
    assert llm.engine.stats["steps"] - steps_before < 400


@pytest.mark.slow
def test_command_line_serves_and_shuts_down_cleanly():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen([sys.executable, "-m", "reference", "serve", "--model", MODEL,
                                "--port", str(port), "--threads", "1"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused",
                               max_retries=0, timeout=30)
        deadline = time.monotonic() + 60
        while True:
            try:
                models = client.models.list()
                break
            except openai.APIConnectionError:
                assert process.poll() is None and time.monotonic() < deadline, "no server came up"
                time.sleep(0.2)
        assert [m.id for m in models.data] == [MODEL]
        reply = client.completions.create(model=MODEL, prompt="hi", max_tokens=3, temperature=0)
        assert reply.usage.completion_tokens == 3
    finally:
        process.send_signal(signal.SIGINT)
        log = process.communicate(timeout=30)[0]
    assert process.returncode == 0, log
    assert "Application shutdown complete" in log and "Traceback" not in log


@pytest.mark.slow
def test_real_model_chat_uses_its_template_and_stops_at_the_end_of_its_turn(real_model):
    model, tok = real_model
    llm = LLM(model, tokenizer=tok, max_num_seqs=4)
    question = "What is the capital of France?"
    ids = tok.chat_ids(question)    # the GGUF's ChatML template, one user turn
    with BackgroundServer(build_app(llm, "smollm2-135m")) as running:
        client = openai.OpenAI(base_url=running.url + "/v1", api_key="unused", max_retries=0,
                               timeout=60)
        kwargs = dict(model="smollm2-135m", messages=[{"role": "user", "content": question}],
                      max_tokens=32, temperature=0)
        reply = client.chat.completions.create(**kwargs)
        chunks = list(client.chat.completions.create(**kwargs, stream=True))
    expected = generate(model, ids, 32, stop_ids=tok.stop_ids)
    assert reply.choices[0].message.content == tok.decode(expected)
    assert reply.choices[0].finish_reason == "stop", "the reply ran past <|im_end|>"
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (len(ids), len(expected))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == reply.choices[0].message.content


def test_command_line_refuses_bad_engine_knobs_in_one_line(capsys):
    from reference.__main__ import main

    assert main(["serve", "--model", MODEL, "--max-num-seqs", "32",
                 "--max-num-batched-tokens", "4"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: max_num_batched_tokens (4) must be >= max_num_seqs (32)")
    assert len(error.strip().splitlines()) == 1
