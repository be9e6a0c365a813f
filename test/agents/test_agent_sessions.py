"""The recording rule: an episode's calls that continue one another are one token trajectory
(the text between them masked), a rewritten history starts a new segment, and every call is a
record of torchrl's LLM layout in the server's ``ReplayBuffer``."""

from __future__ import annotations

import pytest
import torch
from _agents_helpers import MODEL, client_of, serve_toy

from torchrl_trl_interop import OpenAIServer, history_to_messages

USER = [{"role": "user", "content": "What is 2 plus 2?"}]
AGAIN = {"role": "user", "content": "Once more."}


def ask(client, messages, **kwargs):
    return client.chat.completions.create(
        model=MODEL, messages=messages, extra_body={"return_token_ids": True}, **kwargs
    ).model_dump()


def session_records(server, session):
    rows = [server.buffer[i] for i in range(len(server.buffer))]
    return [r for r in rows if r["session"] == session]


@pytest.fixture(scope="module")
def served():
    yield from serve_toy()


class TestRecordingRule:
    def test_a_continuation_is_one_trajectory(self, served):
        server, _, _ = served
        tok = server.tokenizer
        client = client_of(server.session_url("merge"))
        first = ask(client, USER)
        answer = first["choices"][0]["message"]["content"]
        second = ask(client, [*USER, {"role": "assistant", "content": answer}, AGAIN])
        trajectory = server.trajectory("merge")

        ids1, ids2 = first["choices"][0]["token_ids"], second["choices"][0]["token_ids"]
        assert list(trajectory.prompt_ids) == first["prompt_token_ids"]
        # the second call was prompted with the trajectory so far: not a re-rendering
        assert second["prompt_token_ids"][: len(first["prompt_token_ids"]) + len(ids1)] == (
            first["prompt_token_ids"] + ids1
        )
        between = second["prompt_token_ids"][len(first["prompt_token_ids"]) + len(ids1) :]
        assert list(trajectory.completion_ids) == ids1 + between + ids2
        assert list(trajectory.env_mask) == [1] * len(ids1) + [0] * len(between) + [1] * len(ids2)
        assert tok.decode(between).endswith(
            "<|im_start|>user\nOnce more.<|im_end|>\n<|im_start|>assistant\n"
        )
        logprobs = [
            e["logprob"] for c in (first, second) for e in c["choices"][0]["logprobs"]["content"]
        ]
        policy = [v for v, m in zip(trajectory.logprobs, trajectory.env_mask) if m]
        assert policy == pytest.approx(logprobs)
        assert all(v == 0.0 for v, m in zip(trajectory.logprobs, trajectory.env_mask) if not m)
        assert trajectory.messages[-1]["content"] == second["choices"][0]["message"]["content"]

        records = session_records(server, "merge")
        assert [(int(r["call"]), int(r["segment"])) for r in records] == [(0, 0), (1, 0)]
        last = records[-1]
        full = list(trajectory.prompt_ids) + list(trajectory.completion_ids)
        assert last["tokens", "full"].tolist() == full
        assert last["tokens", "prompt"].tolist() == second["prompt_token_ids"]
        assert last["tokens", "response"].tolist() == ids2
        mask = last["masks", "all_assistant_mask"]
        assert mask.tolist() == [False] * len(trajectory.prompt_ids) + [
            bool(m) for m in trajectory.env_mask
        ]
        torch.testing.assert_close(
            last["log_probs", "full"][mask], torch.tensor(logprobs), atol=1e-6, rtol=0
        )
        assert history_to_messages(last["history", "full"])[-2:] == [
            AGAIN,
            {"role": "assistant", "content": second["choices"][0]["message"]["content"]},
        ]
        assert int(last["policy_version"]) == -1  # the policy stamps none, nothing was pushed

    def test_a_rewritten_history_starts_a_segment(self, served):
        server, _, _ = served
        tok = server.tokenizer
        client = client_of(server.session_url("rewrite"))
        ask(client, USER)
        rewritten = [*USER, {"role": "assistant", "content": "It is 4."}, AGAIN]  # not the answer
        second = ask(client, rewritten)
        text = tok.apply_chat_template(rewritten, add_generation_prompt=True, tokenize=False)
        assert second["prompt_token_ids"] == tok(text, add_special_tokens=False)["input_ids"]
        trajectory, calls, segments = server.end_session("rewrite")
        assert (calls, segments, trajectory.segment) == (2, 2, 1)
        assert list(trajectory.prompt_ids) == second["prompt_token_ids"]
        assert list(trajectory.env_mask) == [1] * len(second["choices"][0]["token_ids"])
        assert server.trajectory("rewrite") is None  # ended; its calls stay in the buffer
        assert [int(r["segment"]) for r in session_records(server, "rewrite")] == [0, 1]

    def test_any_choice_can_be_continued(self, served):
        server, _, _ = served
        client = client_of(server.session_url("choices"))
        first = ask(client, USER, n=3)
        picked = first["choices"][2]
        second = ask(
            client, [*USER, {"role": "assistant", "content": picked["message"]["content"]}, AGAIN]
        )
        assert second["prompt_token_ids"][
            : len(first["prompt_token_ids"]) + len(picked["token_ids"])
        ] == (first["prompt_token_ids"] + picked["token_ids"])
        assert server.trajectory("choices").segment == 0

    def test_completion_calls_continue_by_token_prefix(self, served):
        server, _, _ = served
        client = client_of(server.session_url("tokens"))
        prompt = [5, 6, 7]
        first = client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=3, extra_body={"return_token_ids": True}
        ).model_dump()["choices"][0]
        extra = [9, 10]
        client.completions.create(
            model=MODEL,
            prompt=prompt + first["token_ids"] + extra,
            max_tokens=3,
            extra_body={"return_token_ids": True},
        )
        trajectory = server.trajectory("tokens")
        assert list(trajectory.prompt_ids) == prompt
        n = len(first["token_ids"])
        assert list(trajectory.completion_ids[: n + 2]) == first["token_ids"] + extra
        assert list(trajectory.env_mask[: n + 2]) == [1] * n + [0, 0]

    def test_session_ids_checked(self, served):
        server, _, _ = served
        with pytest.raises(ValueError, match="OpenAIServer: session_id must be"):
            server.session_url("a/b")
        url = server.session_url("ep-1")
        assert url.endswith("/sessions/ep-1/v1") and OpenAIServer.session_of(url) == "ep-1"
