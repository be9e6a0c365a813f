"""``OpenAIServer``: a TorchRL policy behind an OpenAI-compatible endpoint, through the real
``openai`` client: the tokens it returns are the template's prompt and the policy's own
samples and log-probs, every field is honoured or refused with OpenAI's error shape, concurrent
clients are batched, weights pushed with ``WeightSyncCallback(server)`` reach the policy."""

from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest
import torch
from _agents_helpers import MODEL, client_of, own_logprobs, serve_toy, toy_policy

from torchrl_trl_interop import OpenAIServer, WeightSyncCallback, weights_checksum
from torchrl_trl_interop.testing import toy_causal_lm, toy_tokenizer

TOL = 1e-4
QUESTION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 plus 2?"}]


def rendered_ids(tok, messages, tools=None):
    """The tokenizer's own rendering of a prompt, tokenized as TRL tokenizes it."""
    text = tok.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=False
    )
    return tok(text, add_special_tokens=False)["input_ids"]


def check_choice(choice, prompt_ids, model, tok):
    """One log-prob per sampled id, each the model's own; the content is the ids' text."""
    ids = choice["token_ids"]
    logprobs = [entry["logprob"] for entry in choice["logprobs"]["content"]]
    assert len(ids) == len(logprobs) > 0
    own = own_logprobs(model, prompt_ids, ids)
    torch.testing.assert_close(torch.tensor(logprobs), own, atol=TOL, rtol=0)
    ended = ids[-1] == tok.eos_token_id
    assert choice["finish_reason"] == ("stop" if ended else "length")
    assert choice["message"]["content"] == tok.decode(ids[:-1] if ended else ids)


@pytest.fixture(scope="module")
def served():
    yield from serve_toy()


class TestChatCompletions:
    def test_token_ids_logprobs_and_policy_version(self, served):
        server, client, model = served
        tok = server.tokenizer
        reply = client.chat.completions.create(
            model=MODEL, messages=QUESTION, n=2, extra_body={"return_token_ids": True}
        )
        fields = reply.model_dump()
        assert fields["prompt_token_ids"] == rendered_ids(tok, QUESTION)
        assert fields["policy_version"] is None  # nothing pushed yet
        assert len(fields["choices"]) == 2
        for choice in fields["choices"]:
            check_choice(choice, fields["prompt_token_ids"], model, tok)
        assert fields["usage"]["prompt_tokens"] == len(fields["prompt_token_ids"])

        # weights pushed as to any generator: the next answer is the new weights' sample
        trained = toy_causal_lm(tokenizer=tok, seed=7)
        from transformers import TrainerControl, TrainerState

        callback = WeightSyncCallback(server)
        callback.on_train_begin(None, TrainerState(global_step=3), TrainerControl(), model=trained)
        assert server.policy_version == 3
        assert weights_checksum(model) == weights_checksum(trained)
        fields = client.chat.completions.create(
            model=MODEL, messages=QUESTION, extra_body={"return_token_ids": True}
        ).model_dump()
        assert fields["policy_version"] == 3
        check_choice(fields["choices"][0], fields["prompt_token_ids"], trained, tok)

    def test_logprobs_without_token_ids(self, served):
        server, client, model = served
        reply = client.chat.completions.create(model=MODEL, messages=QUESTION, logprobs=True)
        entries = reply.choices[0].logprobs.content
        assert entries and all(e.top_logprobs == [] for e in entries)
        assert "prompt_token_ids" not in reply.model_dump()

    def test_seed_stop_and_max_tokens_cut_the_same_sample(self, served):
        """A seed reproduces a sample; ``max_tokens`` and ``stop`` keep a prefix of its ids,
        log-probs unchanged, and the text leaves the stop string out."""
        server, client, _ = served
        tok = server.tokenizer

        def ask(**kwargs):
            return client.chat.completions.create(
                model=MODEL,
                messages=QUESTION,
                seed=11,
                extra_body={"return_token_ids": True},
                **kwargs,
            ).model_dump()["choices"][0]

        whole = ask()
        assert ask()["token_ids"] == whole["token_ids"]
        short = ask(max_tokens=2)
        assert short["token_ids"] == whole["token_ids"][:2]
        assert short["finish_reason"] == "length"
        assert [e["logprob"] for e in short["logprobs"]["content"]] == [
            e["logprob"] for e in whole["logprobs"]["content"][:2]
        ]
        text = whole["message"]["content"]
        stop = next(text[k : k + 2] for k in range(1, len(text) - 1) if text[k : k + 2].strip())
        cut = ask(stop=[stop])
        assert cut["message"]["content"] == text[: text.find(stop)]
        assert cut["finish_reason"] == "stop"
        kept = cut["token_ids"]
        assert kept == whole["token_ids"][: len(kept)]
        assert stop in tok.decode(kept) and stop not in tok.decode(kept[:-1])

    def test_stream_sends_the_same_answer(self, served):
        server, client, _ = served
        stream = client.chat.completions.create(
            model=MODEL,
            messages=QUESTION,
            seed=5,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"return_token_ids": True},
        )
        chunks = [chunk.model_dump() for chunk in stream]
        whole = client.chat.completions.create(
            model=MODEL, messages=QUESTION, seed=5, extra_body={"return_token_ids": True}
        ).model_dump()
        content = "".join(c["choices"][0]["delta"]["content"] or "" for c in chunks if c["choices"])
        assert content == whole["choices"][0]["message"]["content"]
        finish = [
            c["choices"][0] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]
        ]
        assert finish[0]["token_ids"] == whole["choices"][0]["token_ids"]
        assert chunks[0]["prompt_token_ids"] == whole["prompt_token_ids"]
        assert chunks[-1]["usage"]["completion_tokens"] == len(finish[0]["token_ids"])

    def test_eight_concurrent_clients_are_all_answered_in_batches(self, served):
        """Eight clients at once: each gets the answer to its own prompt, and the requests that
        waited while the policy was busy were served by one policy call."""
        server, client, _ = served
        tok = server.tokenizer
        submitted, served = [], []
        submit, run = server._batcher.submit, server._batcher.run

        def counting(job):
            submitted.append(job)
            return submit(job)

        def recording(batch):
            served.append([job for job in batch if job in submitted])
            return run(batch)

        server._batcher.submit, server._batcher.run = counting, recording
        replies = [None] * 8

        def ask(i):
            messages = [{"role": "user", "content": f"Question {i}"}]
            replies[i] = client.chat.completions.create(
                model=MODEL, messages=messages, extra_body={"return_token_ids": True}
            ).model_dump()

        try:
            with server._lock:  # the policy is busy: every request queues
                threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
                for thread in threads:
                    thread.start()
                deadline = time.monotonic() + 60
                while len(submitted) < 8 and time.monotonic() < deadline:
                    time.sleep(0.01)
            for thread in threads:
                thread.join(120)
        finally:
            server._batcher.submit, server._batcher.run = submit, run
        for i, reply in enumerate(replies):
            prompt = rendered_ids(tok, [{"role": "user", "content": f"Question {i}"}])
            assert reply["prompt_token_ids"] == prompt
            assert reply["choices"][0]["token_ids"]
        # these 8 requests: the first batch (taken before the policy was free) and one more for
        # all the others (a batch of an earlier test still in flight is not counted)
        ours = [batch for batch in served if batch]
        assert sum(len(batch) for batch in ours) == 8 and len(ours) <= 2, [len(b) for b in ours]


class TestCompletions:
    def test_text_and_token_prompts(self, served):
        server, client, model = served
        tok = server.tokenizer
        reply = client.completions.create(
            model=MODEL, prompt="Hello there", max_tokens=3, extra_body={"return_token_ids": True}
        ).model_dump()
        choice = reply["choices"][0]
        assert choice["prompt_token_ids"] == tok("Hello there")["input_ids"]
        assert len(choice["token_ids"]) <= 3
        torch.testing.assert_close(
            torch.tensor(choice["logprobs"]["token_logprobs"]),
            own_logprobs(model, choice["prompt_token_ids"], choice["token_ids"]),
            atol=TOL,
            rtol=0,
        )
        ids = [[5, 6, 7], [8, 9]]
        reply = client.completions.create(
            model=MODEL, prompt=ids, n=2, max_tokens=2, extra_body={"return_token_ids": True}
        ).model_dump()
        assert [c["prompt_token_ids"] for c in reply["choices"]] == [ids[0]] * 2 + [ids[1]] * 2


def _status(call):
    try:
        call()
    except openai.APIStatusError as err:
        return err.status_code, err.body
    raise AssertionError("the request was served")


#: request changes, the status and the ``param`` named
BAD_CHAT = [
    ({"temperature": 0.3}, 400, "temperature"),
    ({"top_p": 0.5}, 400, "top_p"),
    ({"n": 0}, 400, "n"),
    ({"logprobs": True, "top_logprobs": 2}, 400, "top_logprobs"),
    ({"presence_penalty": 0.5}, 400, "presence_penalty"),
    ({"logit_bias": {"5": 10}}, 400, "logit_bias"),
    ({"response_format": {"type": "json_object"}}, 400, "response_format"),
    ({"stop": [""]}, 400, "stop"),
    ({"model": "gpt-4o"}, 404, "model"),
    ({"extra_body": {"guided_json": {}}}, 400, "guided_json"),
    ({"stream_options": {"include_usage": True}}, 400, "stream_options"),
    (
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        400,
        "messages[0].content",
    ),
    ({"messages": [{"role": "robot", "content": "Hi"}]}, 400, "messages[0].role"),
    ({"messages": []}, 400, "messages"),
    (
        {"tools": [{"type": "function", "function": {"name": "add"}}], "tool_choice": "required"},
        400,
        "tool_choice",
    ),
    ({"tools": [{"type": "function", "function": {"name": "add"}}]}, 400, "tools"),
]


class TestRefusals:
    @pytest.mark.parametrize("change, status, param", BAD_CHAT)
    def test_chat_field_refused_in_openai_shape(self, served, change, status, param):
        _, client, _ = served
        request = {"model": MODEL, "messages": QUESTION, **change}
        code, body = _status(lambda: client.chat.completions.create(**request))
        assert code == status
        assert body["param"] == param
        assert body["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
        assert param.split(".")[0].split("[")[0] in body["message"] or status == 404

    @pytest.mark.parametrize(
        "change, param",
        [
            ({"echo": True}, "echo"),
            ({"logprobs": 2}, "logprobs"),
            ({"best_of": 3}, "best_of"),
            ({"prompt": [[5, 10**6]]}, "prompt"),
        ],
    )
    def test_completion_field_refused(self, served, change, param):
        _, client, _ = served
        request = {"model": MODEL, "prompt": "Hi", **change}
        code, body = _status(lambda: client.completions.create(**request))
        assert (code, body["param"]) == (400, param)

    def test_not_json_and_unknown_routes(self, served):
        server, _, _ = served
        reply = httpx.post(f"{server.base_url}/chat/completions", content=b"{not json", timeout=30)
        assert reply.status_code == 400
        assert "not valid JSON" in reply.json()["error"]["message"]
        reply = httpx.get(f"{server.base_url}/embeddings", timeout=30)
        assert reply.status_code == 404 and reply.json()["error"]["type"] == "not_found_error"
        reply = httpx.get(f"{server.base_url}/chat/completions", timeout=30)
        assert reply.status_code == 405
        models = httpx.get(f"{server.base_url}/models", timeout=30).json()
        assert [m["id"] for m in models["data"]] == [MODEL]


class TestServer:
    def test_arguments_checked(self):
        tok = toy_tokenizer()
        policy = toy_policy(tok)
        with pytest.raises(TypeError, match="OpenAIServer: policy must be a torchrl LLM policy"):
            OpenAIServer(object(), tokenizer=tok)
        with pytest.raises(ValueError, match="required_tool_choice must be"):
            OpenAIServer(policy, tokenizer=tok, required_tool_choice="force")
        with pytest.raises(ValueError, match="port must be in"):
            OpenAIServer(policy, tokenizer=tok, port=70000)
        policy.prefer_tokens = False
        with pytest.raises(ValueError, match="prefer_tokens=False"):
            OpenAIServer(policy, tokenizer=tok)

    def test_unknown_temperature_refused_clearly(self):
        """A policy whose temperature the server cannot read (a RemotePolicy's) refuses a
        request naming one, until the server is told."""
        from torchrl_trl_interop.agents._requests import ClientError, PolicyLimits, read_chat

        limits = PolicyLimits(model=MODEL, vocab_size=10)
        request = {"model": MODEL, "messages": QUESTION, "temperature": 1.0}
        with pytest.raises(ClientError, match=r"OpenAIServer\(\.\.\., temperature="):
            read_chat(request, limits)
        read_chat(request, PolicyLimits(model=MODEL, vocab_size=10, temperature=1.0))

    def test_a_busy_port_is_refused_before_anything_starts(self, served):
        server, _, _ = served
        tok = server.tokenizer
        port = int(server.base_url.rsplit(":", 1)[1].split("/")[0])
        other = OpenAIServer(toy_policy(tok), tokenizer=tok, port=port)
        with pytest.raises(OSError, match=f"OpenAIServer: cannot serve on 127.0.0.1:{port}"):
            other.start()
        assert not other.started and not other._batcher.alive

    def test_connections_send_without_delay(self, served):
        """Accepted connections inherit TCP_NODELAY: uvicorn writes a response's head and body
        apart, and Nagle's algorithm would hold the body for the client's delayed ACK."""
        import socket

        server, _, _ = served
        assert server._sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)

    def test_close_stops_serving(self):
        tok = toy_tokenizer()
        server = OpenAIServer(toy_policy(tok), tokenizer=tok, model_name=MODEL).start()
        url = server.base_url
        assert client_of(url).models.list().data[0].id == MODEL
        server.close()
        assert not server.started
        with pytest.raises(openai.APIConnectionError):
            client_of(url).models.list()
        with pytest.raises(RuntimeError, match="not serving"):
            server.base_url  # noqa: B018


class TestRemotePolicy:
    def test_a_policy_in_another_process_with_its_versions(self):
        """A ``RemotePolicy``: weights pushed through the server are committed between two of
        its calls, and its answers carry the version it stamps; a seed is refused (its random
        generator is in the other process), a temperature only once the server is told it."""
        from functools import partial

        from transformers import TrainerControl, TrainerState

        from torchrl_trl_interop import RemotePolicy
        from torchrl_trl_interop.testing import toy_generator_policy

        tok = toy_tokenizer()
        remote = RemotePolicy(partial(toy_generator_policy), num_threads=1, timeout=120)
        trained = toy_causal_lm(tokenizer=tok, seed=5)
        try:
            with OpenAIServer(remote, tokenizer=tok, model_name=MODEL, temperature=1.0) as server:
                state = TrainerState(global_step=4)
                WeightSyncCallback(server).on_train_begin(
                    None, state, TrainerControl(), model=trained
                )
                client = client_of(server.base_url)
                fields = client.chat.completions.create(
                    model=MODEL,
                    messages=QUESTION,
                    temperature=1.0,
                    extra_body={"return_token_ids": True},
                ).model_dump()
                code, body = _status(
                    lambda: client.chat.completions.create(model=MODEL, messages=QUESTION, seed=1)
                )
        finally:
            remote.close()
        assert fields["policy_version"] == 4 and server.policy_version == 4
        check_choice(fields["choices"][0], fields["prompt_token_ids"], trained, tok)
        assert (code, body["param"]) == (400, "seed")
