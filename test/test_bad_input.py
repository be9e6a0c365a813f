"""Bad input gets a clear error at the public entry point: the right type, naming the argument.

One table, every public entry point: each case is a call with one bad argument, the exception
type it must raise, and the argument name the message must hold. Before these checks, several of
them raised raw ``AttributeError``/``IndexError`` from deep inside torch, tensordict or datasets,
or were accepted and gave wrong data (``keys="tokens"`` iterated as characters).
"""

from __future__ import annotations

import math
import re

import pytest
import torch
from tensordict import TensorDict, lazy_stack
from torchrl.data import LazyStackStorage, LazyTensorStorage, ReplayBuffer

from torchrl_trl_interop import (
    CommittedWriter,
    HFRewardModelWrapper,
    PaddingCollator,
    RewardTransform,
    TorchRLBufferDataset,
    TRLRewardFuncWrapper,
    as_trl_environment_factory,
    as_trl_reward_func,
    as_trl_rollout_func,
    as_trl_tools,
    build_preference_pairs,
    history_to_messages,
    messages_to_history,
    replay_buffer_from_hf,
    rows_to_tensordict,
    split_columns,
    split_prompt_completion,
)
from torchrl_trl_interop.testing import (
    toy_add,
    toy_buffer,
    toy_calculator_env,
    toy_reward_model,
    toy_tokenizer,
)

CHAT = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]


def toy_primed_calculator():
    """The calculator with its own prompt source (a DataLoadingPrimer)."""
    from torchrl.envs.llm.transforms.dataloading import DataLoadingPrimer

    primer = DataLoadingPrimer(
        dataloader=[{"query": ["What is 2 plus 3?"]}], batch_size=(1,), repeats=1
    )
    return toy_calculator_env().append_transform(primer)


def brevity(completions, **kwargs):
    return [-float(len(c[0]["content"])) for c in completions]


def chats_td(n: int = 2) -> TensorDict:
    return TensorDict({"history": {"full": messages_to_history([CHAT] * n)}}, batch_size=[n])


def tokens_td(rows) -> TensorDict:
    return lazy_stack(
        [
            TensorDict(
                {
                    ("tokens", "full"): torch.tensor(r),
                    ("masks", "all_attention_mask"): torch.ones(len(r), dtype=torch.bool),
                }
            )
            for r in rows
        ]
    )


def chat_env():
    from torchrl.envs.llm import ChatEnv

    return ChatEnv(batch_size=(2,), tokenizer=toy_tokenizer(), input_mode="history")


def rm():
    return HFRewardModelWrapper(toy_reward_model("llama"), inference_mode=True)


def rewards_td(rewards) -> TensorDict:
    td = chats_td(len(rewards))
    td["reward"] = torch.tensor(rewards)
    return td


def func_returning(value):
    def scorer(completions, **kwargs):
        return value if not callable(value) else value(len(completions))

    return scorer


# (id, call, exception type, the argument the message must name)
CASES = [
    # -- a str where a list of keys / names is expected
    ("completion_roles-str-is-one-role", None, None, None),  # see test_a_str_is_one_name
    # -- wrong types, formerly raw AttributeErrors
    (
        "dataset-rename-list",
        lambda: TorchRLBufferDataset(toy_buffer(4), 2, rename=[("x", "y")]),
        TypeError,
        "rename",
    ),
    (
        "rows-rename-list",
        lambda: rows_to_tensordict([{"a": 1}], rename=[("a", "b")]),
        TypeError,
        "rename",
    ),
    (
        "from_hf-rename-list",
        lambda: replay_buffer_from_hf([{"a": 1}], rename=[("a", "b")]),
        TypeError,
        "rename",
    ),
    ("from_hf-None", lambda: replay_buffer_from_hf(None), TypeError, "dataset"),
    (
        "from_hf-columns-int",
        lambda: replay_buffer_from_hf([{"a": 1}], columns=3),
        TypeError,
        "columns",
    ),
    (
        "from_hf-storage-int",
        lambda: replay_buffer_from_hf([{"a": 1}], storage=3),
        TypeError,
        "storage",
    ),
    (
        "rm-tokenizer-str",
        lambda: HFRewardModelWrapper(toy_reward_model(), tokenizer="gpt2", text_key="text"),
        TypeError,
        "tokenizer",
    ),
    (
        "reward-func-processing-class-str",
        lambda: as_trl_reward_func(rm(), token_key="t", processing_class="gpt2"),
        TypeError,
        "processing_class",
    ),
    ("collator-tokenizer-str", lambda: PaddingCollator("gpt2"), TypeError, "tokenizer"),
    # -- TRL's tool loop: as_trl_environment_factory, as_trl_tools
    (
        "env-factory-processing-class-str",
        lambda: as_trl_environment_factory(toy_calculator_env, processing_class="gpt2"),
        TypeError,
        "processing_class",
    ),
    (
        "env-factory-rename-list",
        lambda: as_trl_environment_factory(toy_calculator_env, rename=[("add", "plus")]),
        TypeError,
        "rename",
    ),
    (
        "env-factory-row_keys-int",
        lambda: as_trl_environment_factory(toy_calculator_env, row_keys=3),
        TypeError,
        "row_keys",
    ),
    (
        "env-factory-reward_key-int",
        lambda: as_trl_environment_factory(toy_calculator_env, reward_key=3),
        TypeError,
        "reward_key",
    ),
    (
        "env-factory-get_reward-str",
        lambda: as_trl_environment_factory(toy_calculator_env, get_reward="no"),
        TypeError,
        "get_reward",
    ),
    (
        "env-own-prompts-and-a-row-prompt",
        lambda: as_trl_environment_factory(toy_primed_calculator)().reset(prompt="Hi"),
        ValueError,
        "DataLoadingPrimer",
    ),
    (
        "rollout-mixed-prompt-kinds",
        lambda: as_trl_rollout_func(chat_env())(["Hi", [{"role": "user", "content": "Ho"}]], None),
        TypeError,
        "prompts[0]",
    ),
    ("tools-str", lambda: as_trl_tools("add"), TypeError, "tools"),
    ("rm-forward-dict", lambda: rm()({"tokens": [1, 2]}), TypeError, "tensordict"),
    ("rm-forward-None", lambda: rm()(None), TypeError, "tensordict"),
    ("funcs-forward-dict", lambda: TRLRewardFuncWrapper(brevity)({}), TypeError, "tensordict"),
    ("weights-str", lambda: TRLRewardFuncWrapper(brevity, weights=["a"]), TypeError, "weights[0]"),
    ("weights-float", lambda: TRLRewardFuncWrapper(brevity, weights=1.0), TypeError, "weights"),
    (
        "weights-nan",
        lambda: TRLRewardFuncWrapper(brevity, weights=[math.nan]),
        ValueError,
        "weights[0]",
    ),
    (
        "weights-inf",
        lambda: TRLRewardFuncWrapper(brevity, weights=[math.inf]),
        ValueError,
        "weights[0]",
    ),
    (
        "kwargs_keys-list",
        lambda: TRLRewardFuncWrapper(brevity, kwargs_keys=["answer"]),
        TypeError,
        "kwargs_keys",
    ),
    (
        "reward-func-kwargs_keys-list",
        lambda: as_trl_reward_func(rm(), kwargs_keys=["answer"]),
        TypeError,
        "kwargs_keys",
    ),
    (
        "rm-chat_template_kwargs-list",
        lambda: HFRewardModelWrapper(
            toy_reward_model(), tokenizer=toy_tokenizer(), history_key="h", chat_template_kwargs=[1]
        ),
        TypeError,
        "chat_template_kwargs",
    ),
    (
        "history_to_messages-dict",
        lambda: history_to_messages({"role": "user"}),
        TypeError,
        "History",
    ),
    ("split_columns-not-td", lambda: split_columns({"a": torch.zeros(2)}), TypeError, "batch"),
    (
        "rollout-policy-str",
        lambda: as_trl_rollout_func(chat_env(), policy="gpt2"),
        TypeError,
        "policy",
    ),
    (
        "rollout-recompute-str",
        lambda: as_trl_rollout_func(chat_env(), recompute_logprobs="yes"),
        TypeError,
        "recompute_logprobs",
    ),
    (
        "rollout-reward_key-int",
        lambda: as_trl_rollout_func(chat_env(), reward_key=3),
        TypeError,
        "reward_key",
    ),
    (
        "transform-reward_key-int",
        lambda: RewardTransform(TRLRewardFuncWrapper(brevity), reward_key=3),
        TypeError,
        "reward_key",
    ),
    ("writer-compilable-str", lambda: CommittedWriter(compilable="x"), TypeError, "compilable"),
    ("collator-pad-str", lambda: PaddingCollator(pad_token_id="0"), TypeError, "pad_token_id"),
    (
        "collator-pad_values-list",
        lambda: PaddingCollator(pad_token_id=0, pad_values=[1]),
        TypeError,
        "pad_values",
    ),
    (
        "dataset-device-float",
        lambda: TorchRLBufferDataset(toy_buffer(4), 2, device=3.5),
        TypeError,
        "device",
    ),
    ("reward-func-device-float", lambda: as_trl_reward_func(rm(), device=3.5), TypeError, "device"),
    # -- sizes
    (
        "chunk_size-0",
        lambda: TorchRLBufferDataset(toy_buffer(4), 2).to_hf_dataset(chunk_size=0),
        ValueError,
        "chunk_size",
    ),
    (
        "iter_storage-chunk_size-neg",
        lambda: list(TorchRLBufferDataset(toy_buffer(4), 2).iter_storage(chunk_size=-1)),
        ValueError,
        "chunk_size",
    ),
    (
        "from_hf-chunk_size-float",
        lambda: replay_buffer_from_hf([{"a": 1}], chunk_size=1.5),
        ValueError,
        "chunk_size",
    ),
    (
        "from_hf-batch_size-neg",
        lambda: replay_buffer_from_hf([{"a": 1}], batch_size=-3),
        ValueError,
        "batch_size",
    ),
    (
        "from_hf-max_rows-0",
        lambda: replay_buffer_from_hf([{"a": 1}], max_rows=0),
        ValueError,
        "max_rows",
    ),
    (
        "dataset-batch_size-0",
        lambda: TorchRLBufferDataset(toy_buffer(4), 0),
        ValueError,
        "batch_size",
    ),
    (
        "num_shards-0",
        lambda: TorchRLBufferDataset(toy_buffer(4), 2).as_hf_dataset(num_shards=0),
        ValueError,
        "num_shards",
    ),
    (
        "rm-max_batch_size-0",
        lambda: HFRewardModelWrapper(toy_reward_model(), max_batch_size=0),
        ValueError,
        "max_batch_size",
    ),
    (
        "min_margin-neg",
        lambda: build_preference_pairs(rewards_td([1.0, 0.0]), min_margin=-1.0),
        ValueError,
        "min_margin",
    ),
    (
        "min_margin-str",
        lambda: build_preference_pairs(rewards_td([1.0, 0.0]), min_margin="1"),
        TypeError,
        "min_margin",
    ),
    # -- reward model input, checked before the model runs
    (
        "rm-token-above-vocab",
        lambda: rm()(tokens_td([[5, 6], [7, 10**6]])),
        ValueError,
        "token_key",
    ),
    ("rm-token-negative", lambda: rm()(tokens_td([[5, -1], [7, 8]])), ValueError, "token_key"),
    (
        "rm-row-too-long",  # llama: formerly scored silently past its position limit
        lambda: HFRewardModelWrapper(toy_reward_model("llama", max_position_embeddings=16))(
            tokens_td([[5] * 17, [7, 8]])
        ),
        ValueError,
        "max_position_embeddings",
    ),
    (
        "rm-gpt2-row-too-long",
        lambda: HFRewardModelWrapper(toy_reward_model("gpt2", n_positions=16))(
            tokens_td([[5] * 17, [7, 8]])
        ),
        ValueError,
        "token_key",
    ),
    ("rm-empty-row", lambda: rm()(tokens_td([[5, 6], []])), ValueError, "no real token"),
    # -- reward functions returning the wrong thing: the function is named
    (
        "func-returns-N1-tensor",
        lambda: TRLRewardFuncWrapper(func_returning(lambda n: torch.ones(n, 1)))(chats_td()),
        ValueError,
        "'scorer'",
    ),
    (
        "func-returns-nested-lists",
        lambda: TRLRewardFuncWrapper(func_returning(lambda n: [[1.0]] * n))(chats_td()),
        TypeError,
        "'scorer'",
    ),
    (
        "func-returns-str",
        lambda: TRLRewardFuncWrapper(func_returning(lambda n: ["1.5"] * n))(chats_td()),
        TypeError,
        "'scorer'",
    ),
    (
        "func-returns-inf",
        lambda: TRLRewardFuncWrapper(func_returning(lambda n: [math.inf] * n))(chats_td()),
        ValueError,
        "'scorer'",
    ),
    # -- bool flags accept only bools
    (
        "dataset-epoch-yes",
        lambda: TorchRLBufferDataset(toy_buffer(4), 2, epoch="yes"),
        TypeError,
        "epoch",
    ),
    (
        "rm-inference_mode-yes",
        lambda: HFRewardModelWrapper(toy_reward_model(), inference_mode="yes"),
        TypeError,
        "inference_mode",
    ),
    (
        "rm-unsqueeze-1",
        lambda: HFRewardModelWrapper(toy_reward_model(), unsqueeze_reward=1),
        TypeError,
        "unsqueeze_reward",
    ),
    (
        "collator-mask-str",
        lambda: PaddingCollator(pad_token_id=0, return_attention_mask="no"),
        TypeError,
        "return_attention_mask",
    ),
    (
        "keep_system-str",
        lambda: history_to_messages(messages_to_history(CHAT), keep_system="no"),
        TypeError,
        "keep_system",
    ),
    (
        "transform-only_done-str",
        lambda: RewardTransform(TRLRewardFuncWrapper(brevity), only_done="no"),
        TypeError,
        "only_done",
    ),
    # -- wrong data, formerly accepted
    (
        "pairs-inf-reward",
        lambda: build_preference_pairs(rewards_td([math.inf, 0.0])),
        ValueError,
        "reward",
    ),
    (
        "from_hf-storage-too-small",
        lambda: replay_buffer_from_hf([{"a": i} for i in range(10)], storage=LazyStackStorage(4)),
        ValueError,
        "max_size",
    ),
    # -- data/: issue 19 (helpers speak for the public call) and issue 20 (items 4, 17)
    (
        "split_columns-missing-key",  # formerly a TypeError about a NoneType
        lambda: split_columns(TensorDict({"a": torch.zeros(2)}, [2]), keys=["nope"]),
        KeyError,
        "'nope'",
    ),
    (
        "split_columns-keys-empty",
        lambda: split_columns(TensorDict({"a": torch.zeros(2)}, [2]), keys=[]),
        ValueError,
        "keys",
    ),
    (
        "dataset-keys-empty",  # formerly an empty torch view and an IndexError in to_hf_dataset
        lambda: TorchRLBufferDataset(toy_buffer(4), 2, keys=[]),
        ValueError,
        "keys",
    ),
    (
        "dataset-batch_size-1e12",  # formerly asked the allocator for 8 TB
        lambda: next(iter(TorchRLBufferDataset(toy_buffer(4), 10**12))),
        ValueError,
        "batch_size",
    ),
    (
        "to_hf-bool-then-float",  # formerly typed from row 0: 0.5 became True
        lambda: TorchRLBufferDataset(_per_row([True, 0.5]), 2).to_hf_dataset(),
        TypeError,
        "'score'",
    ),
    (
        "complex-column",
        lambda: TorchRLBufferDataset(
            _rb(TensorDict({"z": torch.ones(4, dtype=torch.complex64)}, [4])), 2
        ).to_hf_dataset(),
        TypeError,
        "'z'",
    ),
]
CASES = [c for c in CASES if c[1] is not None]


def _per_row(scores: list) -> ReplayBuffer:
    """A buffer of one TensorDict per row, each ``score`` as TensorDict stores a Python value."""
    rb = ReplayBuffer(storage=LazyStackStorage(len(scores)))
    for score in scores:
        rb.add(TensorDict({"score": score}))
    return rb


def _rb(td: TensorDict) -> ReplayBuffer:
    rb = ReplayBuffer(storage=LazyTensorStorage(len(td)))
    rb.extend(td)
    return rb


@pytest.mark.parametrize(
    ("call", "error", "names"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_clear_error(call, error, names):
    with pytest.raises(error, match=re.escape(names)) as info:
        call()
    assert type(info.value) is not AttributeError


def _on_another_torchrl(tool, **arguments):
    """Calls a tool as TRL does, on a torchrl whose private tool parsers cannot be read."""
    from torchrl_trl_interop._upstream import plain_upstream

    with plain_upstream():
        return tool(**arguments)


def _adder():
    from torchrl.envs.llm.transforms import SimpleToolTransform

    return SimpleToolTransform(tools={"add": toy_add})


def _calculator_instance():
    """One instance of a TRL environment factory, reset as GRPOTrainer resets it."""
    env = as_trl_environment_factory(toy_calculator_env)()
    env.reset(prompt="What is 2 plus 3?")
    return env


# (id, call, the public call whose name must open the message): a helper's error speaks for the
# call the user made, however deep the helper that raised it.
SIGNED = [
    (
        "split_columns-missing-key",
        lambda: split_columns(TensorDict({"a": torch.zeros(2)}, [2]), keys=["nope"]),
        "split_columns",
    ),
    (
        "split_columns-float-mask",
        lambda: split_columns(TensorDict({"a": torch.zeros(2, 3)}, [2]), attention_mask_key="a"),
        "split_columns",
    ),
    (
        "dataset-keys-empty",
        lambda: TorchRLBufferDataset(toy_buffer(4), 2, keys=[]),
        "TorchRLBufferDataset",
    ),
    (
        "dataset-batch_size-1e12",
        lambda: next(iter(TorchRLBufferDataset(toy_buffer(4), 10**12))),
        "TorchRLBufferDataset",
    ),
    (
        "as_hf_dataset-batch_size-1e12",
        lambda: list(TorchRLBufferDataset(toy_buffer(4), 10**12).as_hf_dataset()),
        "TorchRLBufferDataset.as_hf_dataset",
    ),
    (
        "to_hf_dataset-empty",
        lambda: TorchRLBufferDataset(toy_buffer(0), 2).to_hf_dataset(),
        "TorchRLBufferDataset.to_hf_dataset",
    ),
    (
        "to_hf_dataset-bool-then-float",
        lambda: TorchRLBufferDataset(_per_row([True, 0.5]), 2).to_hf_dataset(),
        "TorchRLBufferDataset.to_hf_dataset",
    ),
    (
        "hf_features-complex",
        lambda: TorchRLBufferDataset(
            _rb(TensorDict({"z": torch.ones(4, dtype=torch.complex64)}, [4])), 2
        ).hf_features(),
        "TorchRLBufferDataset.hf_features",
    ),
    (
        "iter_storage-empty",
        lambda: list(TorchRLBufferDataset(toy_buffer(0), 2).iter_storage()),
        "TorchRLBufferDataset.iter_storage",
    ),
    (
        "pairs-history_key-int",
        lambda: build_preference_pairs(rewards_td([1.0, 0.0]), history_key=3),
        "build_preference_pairs",
    ),
    # raised by the conversion the call runs, not by the call itself (was "messages_to_history")
    (
        "from_hf-content-None",
        lambda: replay_buffer_from_hf([{"prompt": [{"role": "user", "content": None}]}]),
        "replay_buffer_from_hf",
    ),
    # a key check of the ground helpers (was unsigned)
    (
        "rows_to_tensordict-rename-not-a-key",
        lambda: rows_to_tensordict([{"a": 1}], rename={"a": 3}),
        "rows_to_tensordict",
    ),
    # the call the user made, not the one it makes (was "TorchRLBufferDataset.set_epoch")
    (
        "load_state_dict-negative-epoch",
        lambda: TorchRLBufferDataset(toy_buffer(4), 2).load_state_dict(
            {"epoch": -1, "rows": 0, "base": None}
        ),
        "TorchRLBufferDataset.load_state_dict",
    ),
    (  # TRL calls the tool: formerly signed "tool 'add'", not the call that made it
        "as_trl_tools-tool-call-on-another-torchrl",
        lambda: _on_another_torchrl(as_trl_tools(_adder())[0], a=2, b=3),
        "as_trl_tools",
    ),
    (
        "environment-factory-tool-call-on-another-torchrl",
        lambda: _on_another_torchrl(_calculator_instance().add, a=2, b=3),
        "as_trl_environment_factory",
    ),
    (  # the argument check is openenv_app's, which openenv_server calls
        "openenv_server-max_concurrent_envs-0",
        lambda: _served(max_concurrent_envs=0),
        "openenv_server",
    ),
    (  # the environment check is as_openenv_environment's, which openenv_app calls
        "openenv_app-env-of-batch-2",
        lambda: _openenv_app(_chat_env_of_batch(2)),
        "openenv_app",
    ),
]


@pytest.mark.parametrize(("call", "owner"), [c[1:] for c in SIGNED], ids=[c[0] for c in SIGNED])
def test_signed_by_the_public_call(call, owner):
    with pytest.raises((TypeError, ValueError, KeyError, RuntimeError)) as info:
        call()
    assert info.value.args[0].startswith(f"{owner}: "), info.value.args[0]


def _served(**kwargs):
    pytest.importorskip("openenv")
    from torchrl_trl_interop import openenv_server
    from torchrl_trl_interop.testing import toy_tool_env

    with openenv_server(toy_tool_env, **kwargs):
        pass


def _openenv_app(env):
    pytest.importorskip("openenv")
    from torchrl_trl_interop import openenv_app

    return openenv_app(env)


def _chat_env_of_batch(n):
    from torchrl.envs.llm import ChatEnv

    return ChatEnv(batch_size=(n,), input_mode="history")


@pytest.mark.parametrize(
    "call",
    [
        lambda roles: split_prompt_completion(CHAT, completion_roles=roles),
        lambda roles: build_preference_pairs(rewards_td([1.0, 0.0]), completion_roles=roles),
        lambda roles: TRLRewardFuncWrapper(brevity, completion_roles=roles)(chats_td()),
    ],
    ids=["split_prompt_completion", "build_preference_pairs", "TRLRewardFuncWrapper"],
)
def test_a_str_is_one_name(call):
    """Regression: ``completion_roles="assistant"`` was iterated as the roles 'a', 's', 's', ..."""
    call("assistant")  # one role: as ("assistant",)
    with pytest.raises(TypeError, match="completion_roles"):
        call(3)
    with pytest.raises(ValueError, match="completion_roles is empty"):
        call([])


def test_columns_str_is_one_column():
    """Regression: ``columns="prompt"`` was iterated as the columns 'p', 'r', 'o', ..."""
    rb = replay_buffer_from_hf([{"prompt": "a", "other": 1}], columns="prompt")
    assert list(rb[:].keys()) == ["prompt"]
