"""
TorchRL ↔ TRL: replay buffers, reward models and a preference journey
======================================================================

TorchRL collects LLM rollouts into replay buffers of (ragged) TensorDicts; Hugging Face TRL
trains on ``datasets`` objects and calls reward models with padded token batches. This tutorial
walks both directions with ``torchrl_trl_interop``, then puts them together:

1. **TorchRL → TRL**: a replay buffer of collector rollouts becomes a dataset (keys, renames,
   nested keys, ragged rows, Hugging Face views) in the columns each TRL trainer reads.
2. **TRL → TorchRL**: a Hugging Face reward model becomes a TensorDict module whose scores do
   not depend on padding, with or without gradients.
3. **Round trip**: buffer → dataset → collator → reward model, with the same scores as the
   buffer's own rows.
4. **A preference journey on** :class:`~torchrl.data.llm.History`: a toy policy answers
   prompts several times, a rule scores the answers, best-vs-worst pairs train a reward model
   with TRL's ``RewardTrainer``, and the trained model, back in TorchRL, scores fresh rollouts
   better than the untrained one. A short ``GRPOTrainer`` run closes the loop.

Everything runs offline on CPU in about a minute: the tokenizer, the policy and the reward
model are tiny and built from configs (:mod:`torchrl_trl_interop.testing`), with random weights.
Every statement the text makes is checked by an ``assert`` in the code below it.
"""

# %%
# Set-up
# ------
#
# Nothing is downloaded: the Hugging Face libraries are told to stay offline, and matplotlib
# draws off-screen unless you chose a backend yourself. Seeds are fixed, so the run is
# reproducible. Run as a script (``make demo``), the tutorial shows progress bars; the docs
# build (sphinx-gallery, which defines no ``__file__`` and writes all output into the page)
# runs without them.

import copy
import itertools
import os
import time
import warnings
from pathlib import Path

T_START = time.perf_counter()

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MPLBACKEND", "Agg")

import datasets
import matplotlib.pyplot as plt
import torch
from tensordict import TensorDict, set_list_to_stack
from torch.utils.data import DataLoader
from torchrl.data import LazyStackStorage, ReplayBuffer
from tqdm.auto import tqdm
from transformers import DataCollatorWithPadding

from torchrl_trl_interop import (
    HFRewardModelWrapper,
    PaddingCollator,
    TorchRLBufferDataset,
    TRLRewardFuncWrapper,
    as_trl_reward_func,
    build_preference_pairs,
    history_to_messages,
    is_message_list,
    messages_to_history,
    split_prompt_completion,
)
from torchrl_trl_interop.testing import (
    toy_causal_lm,
    toy_collected_buffer,
    toy_prompts,
    toy_reward_model,
    toy_tokenizer,
    toy_trainer_args,
)

# Deprecation notices that torchrl, transformers and torch print on every run; not our topic.
for message in (
    "The env passed to LLMCollector is missing transforms",
    "`(is_)?gradient_checkpointing",
    "size_average and reduce args will be deprecated",
):
    warnings.filterwarnings("ignore", message=message)

SHOW_PROGRESS = "__file__" in globals()  # a plain script, not the docs build
if not SHOW_PROGRESS:
    datasets.disable_progress_bars()

torch.manual_seed(0)
OUT_DIR = Path("outputs")  # relative to the working directory; git-ignored
OUT_DIR.mkdir(exist_ok=True)

# %%
# Part 1 — TorchRL → TRL: a replay buffer as a dataset
# ----------------------------------------------------
#
# :func:`~torchrl_trl_interop.testing.toy_collected_buffer` runs TorchRL's real LLM pipeline: a
# toy causal LM wrapped by ``TransformersWrapper(input_mode="history", pad_output=False)``
# answers the prompts that a ``ChatEnv`` (fed by a ``DataLoadingPrimer``) serves, and an
# ``LLMCollector`` writes each one-turn rollout into a ``ReplayBuffer(LazyStackStorage)``.
# Here four questions of different lengths are each answered twice.

tok = toy_tokenizer(padding_side="left")  # the policy's tokenizer: generation pads on the left
QUESTIONS = ["What is two plus two?", "Hello!", "How are you today?", "What is 7 plus 14?"]
rollouts_rb = toy_collected_buffer(
    tok, prompts=QUESTIONS, repeats=2, env_batch_size=2, total_dialog_turns=8, max_new_tokens=6
)
print(type(rollouts_rb.storage).__name__, len(rollouts_rb), "rows")
with set_list_to_stack(True):  # History needs tensordict's list-to-stack mode: keep it scoped
    rollouts = rollouts_rb[:]
print(sorted(rollouts.keys()))
assert len(rollouts_rb) == 8

# %%
# The rollouts are *ragged*: each row keeps its own number of tokens, so the stored entries are
# lazy stacks. A plain ``get`` cannot stack rows of different lengths and raises; read them as a
# list (or as a padded or nested tensor) instead. The History holds the whole conversation:
# system prompt, user question and the policy's answer.

token_rows = rollouts.get(("tokens", "full"), as_list=True)
lengths = [row.numel() for row in token_rows]
print("tokens per rollout:", lengths)
assert len(set(lengths)) > 1  # ragged
try:
    rollouts.get(("tokens", "full"))
    raise AssertionError("stacking ragged rows should have failed")
except RuntimeError as err:
    assert "Failed to stack" in str(err)

conversations = history_to_messages(rollouts.get(("history", "full")))
print(conversations[0])
assert [m["role"] for m in conversations[0]] == ["system", "user", "assistant"]

# %%
# :class:`~torchrl_trl_interop.TorchRLBufferDataset` turns the buffer into a torch
# ``IterableDataset`` of flat dicts. Every leaf entry is a column, and a nested key such as
# ``("tokens", "full")`` becomes the dotted name ``"tokens.full"``:

every_column = TorchRLBufferDataset(rollouts_rb, batch_size=4).column_names
print(every_column)
assert {"tokens.full", "masks.all_attention_mask", "history.full", "query"} <= set(every_column)

# %%
# ``keys`` selects entries (nested keys are tuples) and ``rename`` gives a column another name.
# Every iteration samples ``num_batches`` (default ``1``) batches of ``batch_size`` rows. Each
# row keeps its true length, the History becomes a TRL message list, and strings stay strings.

dataset = TorchRLBufferDataset(
    rollouts_rb,
    batch_size=4,
    keys=[("tokens", "full"), ("masks", "all_attention_mask"), ("history", "full"), "query"],
    rename={("history", "full"): "messages"},
)
print(dataset)
print(dataset.column_names)
assert dataset.column_names == ["tokens.full", "masks.all_attention_mask", "messages", "query"]

rows = list(dataset)
assert len(rows) == dataset.batch_size * dataset.num_batches == 4
row = rows[0]
print({name: type(value).__name__ for name, value in row.items()})
assert (
    row["tokens.full"].ndim == 1
    and row["tokens.full"].shape == row["masks.all_attention_mask"].shape
)
assert row["tokens.full"].numel() in lengths
assert is_message_list(row["messages"]) and isinstance(row["query"], str)
assert row["messages"][1]["content"] == row["query"]

# %%
# With ``epoch=True`` one pass reads every stored row exactly once, in storage order, instead of
# sampling: the rows come back with exactly the lengths stored.

epoch_rows = list(
    TorchRLBufferDataset(rollouts_rb, batch_size=4, keys=[("tokens", "full")], epoch=True)
)
assert [r["tokens.full"].numel() for r in epoch_rows] == lengths
assert all(torch.equal(r["tokens.full"], t) for r, t in zip(epoch_rows, token_rows))

# %%
# TRL trainers accept only Hugging Face ``datasets`` objects: they refuse a torch
# ``IterableDataset``, and a replay buffer, when they are built. The dataset gives two views:
#
# * :meth:`~torchrl_trl_interop.TorchRLBufferDataset.to_hf_dataset`: a map-style
#   ``datasets.Dataset`` holding every stored row once (it has a ``len``, so trainers can count
#   epochs);
# * :meth:`~torchrl_trl_interop.TorchRLBufferDataset.as_hf_dataset`: a streaming
#   ``datasets.IterableDataset`` that samples the buffer on each pass (with
#   ``num_batches=None`` it streams forever: give the trainer ``max_steps``).
#
# Arrow stores no tensors: there, tensors become lists of numbers.

from trl import RewardConfig, RewardTrainer

for refused in (dataset, rollouts_rb):
    try:
        RewardTrainer(
            model=toy_reward_model("llama", tokenizer=toy_tokenizer()),
            args=RewardConfig(**toy_trainer_args(OUT_DIR / "runs")),
            train_dataset=refused,
            processing_class=toy_tokenizer(),
        )
        raise AssertionError(f"RewardTrainer accepted a {type(refused).__name__}")
    except TypeError as err:
        print("TypeError:", err)

hf_dataset = dataset.to_hf_dataset()
print(hf_dataset)
assert isinstance(hf_dataset, datasets.Dataset) and len(hf_dataset) == len(rollouts_rb)
assert hf_dataset.column_names == dataset.column_names
assert hf_dataset[0]["messages"] == conversations[0]  # storage order
assert hf_dataset[0]["tokens.full"] == token_rows[0].tolist()

hf_stream = dataset.as_hf_dataset()
print(hf_stream.features)
assert isinstance(hf_stream, datasets.IterableDataset)
assert len(list(hf_stream)) == dataset.batch_size  # one sampled batch per pass

endless = TorchRLBufferDataset(rollouts_rb, batch_size=4, keys=["query"], num_batches=None)
assert len(list(itertools.islice(endless.as_hf_dataset(), 5 * len(rollouts_rb)))) == 40

# %%
# Which TRL trainer reads which columns (TRL 1.16). Conversational columns hold message lists,
# which is what a History becomes:
#
# ================== ============================================= ===========================
# trainer            columns it reads                              from a TorchRL buffer
# ================== ============================================= ===========================
# ``RewardTrainer``  ``chosen``, ``rejected`` (+ ``prompt``,       pairs made by
#                    ``margin``)                                   ``build_preference_pairs``
# ``DPOTrainer``     ``prompt``, ``chosen``, ``rejected``          the same pairs
# ``SFTTrainer``     ``messages`` (or ``text``, or ``prompt`` and  ``("history", "full")``
#                    ``completion``)                               renamed ``messages``
# ``GRPOTrainer``,   ``prompt``; every other column goes to the    ``("history", "prompt")``
# ``RLOOTrainer``    reward functions as a keyword argument        renamed ``prompt``
# ================== ============================================= ===========================
#
# ``keys`` and ``rename`` build each layout from the same rollouts:

from trl.data_utils import is_conversational

sft_data = TorchRLBufferDataset(
    rollouts_rb, batch_size=8, keys=[("history", "full")], rename={("history", "full"): "messages"}
).to_hf_dataset()
grpo_data = TorchRLBufferDataset(
    rollouts_rb,
    batch_size=8,
    keys=[("history", "prompt"), "query"],
    rename={("history", "prompt"): "prompt"},
).to_hf_dataset()
print(sft_data.column_names, grpo_data.column_names)
assert sft_data.column_names == ["messages"] and grpo_data.column_names == ["prompt", "query"]
assert all(is_conversational(r) for r in sft_data) and all(is_conversational(r) for r in grpo_data)
assert [m["role"] for m in grpo_data[0]["prompt"]] == ["system", "user"]

# %%
# Part 2 — TRL → TorchRL: a Hugging Face reward model as a TensorDict module
# --------------------------------------------------------------------------
#
# :class:`~torchrl_trl_interop.HFRewardModelWrapper` reads the tokens at ``("tokens", "full")``
# and the mask at ``("masks", "all_attention_mask")`` (TorchRL's LLM layout, the defaults),
# calls the model, and writes one reward per row at ``"reward"`` in the same TensorDict. It
# reads the ragged rollouts as they are.

rm_tok = toy_tokenizer()  # the reward model's own tokenizer (right padding, as RewardTrainer)
scorers = {arch: toy_reward_model(arch, tokenizer=rm_tok) for arch in ("llama", "gpt2")}
rm = HFRewardModelWrapper(scorers["llama"], inference_mode=True)
print(rm)
rm(rollouts)
HFRewardModelWrapper(scorers["gpt2"], reward_key="reward_gpt2", inference_mode=True)(rollouts)
ragged_scores = {"llama": rollouts.get("reward"), "gpt2": rollouts.get("reward_gpt2")}
assert ragged_scores["llama"].shape == ragged_scores["gpt2"].shape == (len(rollouts_rb),)

# %%
# Sequence-classification decoders pool the rightmost token that is not
# ``config.pad_token_id``; the attention mask plays no part in that choice, and GPT-2 (absolute
# positions) sees a left-padded row at shifted positions. The wrapper lets the *mask* decide
# which tokens are real, so the same rows padded on the left or on the right, with any padding
# value, get the scores of the rows alone. Called directly on the same batches, the model
# scores right-padded rows on a padding token when the padding value is not its
# ``pad_token_id``, and GPT-2 also gets left-padded rows wrong:


def padded(td, side, value):
    """The rollouts' tokens and mask as one padded batch (a plain TensorDict)."""
    ids = td.get(("tokens", "full"), as_padded_tensor=True, padding_side=side, padding_value=value)
    mask = td.get(
        ("masks", "all_attention_mask"),
        as_padded_tensor=True,
        padding_side=side,
        padding_value=False,
    )
    return TensorDict(
        {"tokens": {"full": ids}, "masks": {"all_attention_mask": mask}}, batch_size=[len(ids)]
    )


left = padded(rollouts, "left", rm_tok.pad_token_id)
right = padded(rollouts, "right", 7)  # 7 is not the pad id: the model's pooling misses it
for arch, model in scorers.items():
    wrapper = HFRewardModelWrapper(model, inference_mode=True)
    for name, batch in (("left", left), ("right", right)):
        scores = wrapper(batch.clone())["reward"]
        with torch.no_grad():
            raw = model(
                input_ids=batch["tokens", "full"],
                attention_mask=batch["masks", "all_attention_mask"].long(),
            ).logits.squeeze(-1)
        wrapper_err = (scores - ragged_scores[arch]).abs().max().item()
        raw_err = (raw - ragged_scores[arch]).abs().max().item()
        print(
            f"{arch:5s} {name:5s}-padded: wrapper error {wrapper_err:.1e}, raw model {raw_err:.1e}"
        )
        assert torch.allclose(scores, ragged_scores[arch], atol=1e-5)
        if name == "right" or arch == "gpt2":
            assert not torch.allclose(raw, ragged_scores[arch], atol=1e-3)

# %%
# Gradients: by default (``inference_mode=False``) the reward keeps its graph, so a loss on it
# trains the reward model (or a critic built on it). With ``inference_mode=True`` the model runs
# under ``torch.no_grad``, and the reward is still a normal tensor, never an inference tensor,
# even inside a caller's ``torch.inference_mode()``.

model = scorers["llama"]
with_grad = HFRewardModelWrapper(model)(left.clone())["reward"]
assert with_grad.requires_grad
with_grad.sum().backward()
assert model.score.weight.grad is not None and model.score.weight.grad.abs().sum() > 0
model.zero_grad(set_to_none=True)

no_grad = HFRewardModelWrapper(model, inference_mode=True)(left.clone())["reward"]
assert not no_grad.requires_grad
with torch.inference_mode():
    inside = HFRewardModelWrapper(model, inference_mode=True)(left.clone())["reward"]
assert not inside.is_inference()
assert torch.allclose(with_grad.detach(), no_grad, atol=1e-6)

# %%
# Part 3 — Round trip: buffer → dataset → collator → reward model
# ---------------------------------------------------------------
#
# :class:`~torchrl_trl_interop.PaddingCollator` is a ``collate_fn`` that pads rows the way
# ``transformers.DataCollatorWithPadding`` does (pad id and side from the tokenizer, ``int64``
# mask). Renamed to ``input_ids``/``attention_mask``, the rows are a standard Hugging Face
# batch; put back into a TensorDict, they are scored exactly as the buffer's own ragged rows
# were.

round_trip = TorchRLBufferDataset(
    rollouts_rb,
    batch_size=4,
    keys=[("tokens", "full"), ("masks", "all_attention_mask")],
    rename={("tokens", "full"): "input_ids", ("masks", "all_attention_mask"): "attention_mask"},
    epoch=True,  # every row once, in storage order, to compare row by row
)
collator = PaddingCollator(tok)
first_rows = list(round_trip)[:4]
reference = DataCollatorWithPadding(tok)(first_rows)
assert all(torch.equal(collator(first_rows)[k], reference[k]) for k in reference)

loader = DataLoader(round_trip, batch_size=4, collate_fn=collator)
scores = []
for batch in loader:
    print(
        {name: tuple(value.shape) for name, value in batch.items()}, "pad side:", tok.padding_side
    )
    assert batch["attention_mask"].dtype == torch.int64
    td = TensorDict(
        {
            "tokens": {"full": batch["input_ids"]},
            "masks": {"all_attention_mask": batch["attention_mask"]},
        },
        batch_size=[len(batch["input_ids"])],
    )
    scores.append(rm(td)["reward"])
scores = torch.cat(scores)
assert torch.allclose(scores, ragged_scores["llama"], atol=1e-5)
print("round-trip scores match the buffer's:", scores.tolist())

# %%
# Part 4 — A preference journey on History
# ----------------------------------------
#
# Now the whole loop, keeping the full conversational context (system prompt, question,
# answer) as a :class:`~torchrl.data.llm.History` from the collector to the trainer and back.
#
# **Collect.** The toy policy answers each of 144 arithmetic questions eight times
# (``repeats=8``); 48 other questions are held out for later. Collection runs in chunks, to
# show progress; every chunk lands in one ``LazyStackStorage`` buffer, which keeps ragged rows
# and per-row History.

N_PROMPTS, REPEATS = 192, 8
all_prompts = toy_prompts(N_PROMPTS)  # "What is i plus 2i?"
held_out_prompts = all_prompts[3::4]  # split by prompt: no held-out question is trained on
train_prompts = [p for p in all_prompts if p not in held_out_prompts]
policy = toy_causal_lm(tokenizer=tok)


def collect(prompts, seed):
    """``REPEATS`` one-turn rollouts per prompt, collected by TorchRL's LLMCollector."""
    return toy_collected_buffer(
        tok,
        policy_model=policy,
        prompts=prompts,
        repeats=REPEATS,
        env_batch_size=32,
        total_dialog_turns=len(prompts) * REPEATS,
        max_new_tokens=16,
        storage_size=len(prompts) * REPEATS,
        seed=seed,
    )


train_rb = ReplayBuffer(storage=LazyStackStorage(len(train_prompts) * REPEATS))
chunk = 24
with tqdm(
    total=len(train_prompts) * REPEATS,
    desc="collecting rollouts",
    unit="rollout",
    disable=not SHOW_PROGRESS,
) as bar:
    for start in range(0, len(train_prompts), chunk):
        part = collect(train_prompts[start : start + chunk], seed=start)
        with set_list_to_stack(True):
            train_rb.extend(part[:])
        bar.update(len(part))
with set_list_to_stack(True):
    train_rollouts = train_rb[:]
print(f"{len(train_rb)} rollouts, e.g.", history_to_messages(train_rollouts[0]["history", "full"]))
assert len(train_rb) == len(train_prompts) * REPEATS == 1152
assert len({t.numel() for t in train_rollouts.get(("tokens", "full"), as_list=True)}) > 1

# %%
# **Score.** The initial reward signal is a rule, written as a TRL reward function (the kind
# ``GRPOTrainer(reward_funcs=...)`` takes): the questions are arithmetic, so an answer earns one
# point per digit it contains. :class:`~torchrl_trl_interop.TRLRewardFuncWrapper` runs it on
# TorchRL rollouts: it splits each History into TRL's ``prompts`` and ``completions`` (message
# lists) and writes the reward into the TensorDict.


def number_reward(completions, **kwargs):
    """One point per digit in the answer (a TRL reward function)."""
    return [float(sum(ch.isdigit() for m in c for ch in m["content"])) for c in completions]


rule = TRLRewardFuncWrapper(number_reward)
print(rule)
rule(train_rollouts)
answers = [c[-1]["content"] for c in history_to_messages(train_rollouts["history", "full"])]
assert train_rollouts["reward"].tolist() == [float(sum(map(str.isdigit, a))) for a in answers]

# %%
# **Pair.** The collector yields rollouts, not preferences: :func:`~torchrl_trl_interop.
# build_preference_pairs` groups the rollouts by prompt and keeps, for each prompt, the
# best-scored answer as ``chosen`` and the worst as ``rejected`` (ties carry no preference and
# are skipped). The pairs go to a new ``ReplayBuffer``, as History, with the reward gap as
# ``margin``.

with set_list_to_stack(True):
    train_pairs = build_preference_pairs(train_rollouts)
    first_pair = train_pairs[0]
    print(
        "pair:", {k: history_to_messages(first_pair[k]) for k in ("prompt", "chosen", "rejected")}
    )
print(f"{len(train_pairs)} training pairs from {len(train_prompts)} prompts")
assert 0.8 * len(train_prompts) < len(train_pairs) <= len(train_prompts)
pair_rows = TorchRLBufferDataset(train_pairs, batch_size=64).to_hf_dataset()
assert set(pair_rows.column_names) == {"prompt", "chosen", "rejected", "margin"}
for pair in pair_rows:
    assert (
        pair["margin"]
        == number_reward([pair["chosen"]])[0] - number_reward([pair["rejected"]])[0]
        > 0
    )

# %%
# **Train.** TRL's ``RewardTrainer`` takes these rows as they are (conversational
# ``prompt``/``chosen``/``rejected``, optional ``margin``): it renders each conversation with
# the reward model's chat template and learns to score ``chosen`` above ``rejected``. With a
# ``margin`` column its loss asks for a score gap of at least the margin; on this toy task
# plain preferences generalised better in our runs, so we drop that column. We keep a copy of
# the untrained model to compare with later.

reward_model = toy_reward_model("llama", tokenizer=rm_tok, seed=0)
untrained_model = copy.deepcopy(reward_model)
trainer = RewardTrainer(
    model=reward_model,
    args=RewardConfig(
        max_length=256,
        learning_rate=1e-3,
        **toy_trainer_args(
            OUT_DIR / "runs",
            max_steps=120,
            per_device_train_batch_size=16,
            logging_steps=20,
            disable_tqdm=not SHOW_PROGRESS,
        ),
    ),
    train_dataset=pair_rows.remove_columns("margin"),
    processing_class=rm_tok,
)
trainer.train()
reward_model.eval()
train_log = [log for log in trainer.state.log_history if "loss" in log]
print("training loss:", [round(log["loss"], 3) for log in train_log])
assert trainer.state.global_step == 120
assert train_log[-1]["loss"] < train_log[0]["loss"]
first_chat = pair_rows[0]["prompt"] + pair_rows[0]["chosen"]
chat_ids = rm_tok.apply_chat_template(first_chat, tokenize=True, return_dict=True)["input_ids"]
assert trainer.train_dataset[0]["chosen_ids"] == chat_ids

# %%
# **Evaluate on fresh rollouts.** The policy now answers the 48 held-out questions (new
# prompts, a new sampling seed), and the rule scores them. The trained model, wrapped by
# :class:`~torchrl_trl_interop.HFRewardModelWrapper`, reads the History at
# ``("history", "full")``, renders it with its tokenizer's chat template as ``RewardTrainer``
# did (same token ids, same score), and writes its score into the rollout TensorDict next to
# the rule's. Its scores now follow the rule (correlation above 0.3); the untrained model's do
# not.

fresh_rb = collect(held_out_prompts, seed=1000)
with set_list_to_stack(True):
    fresh = fresh_rb[:]
rule(fresh)
seen = {conv[1]["content"] for conv in history_to_messages(fresh["history", "full"])}
assert seen == set(held_out_prompts) and not seen & set(train_prompts)


def _fmt(values):
    return ", ".join(f"{name} {value:.2f}" for name, value in values.items())


def rm_on_history(model, history_key=("history", "full"), reward_key="rm_reward"):
    return HFRewardModelWrapper(
        model,
        tokenizer=rm_tok,
        history_key=history_key,
        reward_key=reward_key,
        inference_mode=True,
    )


trained_rm = rm_on_history(reward_model)
trained_rm(fresh)
fresh_conversations = history_to_messages(fresh["history", "full"])
print("rule  RM score  answer")
for conv, rule_reward, rm_reward in list(
    zip(fresh_conversations, fresh["reward"], fresh["rm_reward"])
)[:6]:
    print(f"{rule_reward:4.0f}  {rm_reward:+8.2f}  {conv[-1]['content']!r}")
assert fresh["rm_reward"].shape == fresh["reward"].shape == (len(fresh_rb),)

check = TensorDict({"history": {"full": messages_to_history([first_chat])}}, batch_size=[1])
with torch.no_grad():
    direct = reward_model(input_ids=torch.tensor([chat_ids])).logits[0, 0]
assert torch.allclose(trained_rm(check)["rm_reward"][0], direct, atol=1e-5)

rm_on_history(untrained_model, reward_key="untrained_rm_reward")(fresh)
RM_KEYS = {"untrained": "untrained_rm_reward", "trained": "rm_reward"}
correlation = {
    name: torch.corrcoef(torch.stack([fresh["reward"], fresh[key]]))[0, 1].item()
    for name, key in RM_KEYS.items()
}
print("correlation of the RM score with the rule on fresh rollouts:", _fmt(correlation))
assert correlation["trained"] > 0.3 > correlation["untrained"]

# %%
# The held-out preference pairs are built from the fresh rollouts the same way. With
# ``prompt_key=None`` each side holds the whole conversation (TRL's implicit-prompt format),
# which the wrapper scores directly: a pair is ranked right when ``chosen`` scores above
# ``rejected``. The trained model ranks the held-out pairs clearly better than the untrained
# one, and separates them by a wider margin.

with set_list_to_stack(True):
    held_out = build_preference_pairs(fresh, prompt_key=None)[:]


def held_out_margins(model):
    """Score of ``chosen`` minus score of ``rejected``, per held-out pair."""
    td = held_out.clone()
    rm_on_history(model, "chosen", "chosen_score")(td)
    rm_on_history(model, "rejected", "rejected_score")(td)
    return td["chosen_score"] - td["rejected_score"]


margins = {
    "untrained": held_out_margins(untrained_model),
    "trained": held_out_margins(reward_model),
}
accuracy = {name: (m > 0).float().mean().item() for name, m in margins.items()}
print(f"{len(held_out)} held-out pairs; accuracy:", _fmt(accuracy))
assert accuracy["trained"] > accuracy["untrained"]
assert accuracy["trained"] >= 0.7 and accuracy["trained"] - accuracy["untrained"] >= 0.15
assert margins["trained"].mean() > margins["untrained"].mean()

# %%
# The figure: held-out accuracy before and after training, the distribution of the margins,
# and the mean score of the fresh rollouts by rule reward, for both models.

fig, axes = plt.subplots(1, 3, figsize=(14, 4))
names = ["untrained", "trained"]
axes[0].bar(names, [accuracy[n] for n in names], color=["tab:gray", "tab:blue"])
axes[0].axhline(0.5, color="k", ls="--", lw=1, label="chance")
axes[0].set(ylim=(0, 1), ylabel="accuracy", title=f"Held-out pairs (n={len(held_out)})")
axes[0].legend()
bins = torch.linspace(
    min(m.min() for m in margins.values()), max(m.max() for m in margins.values()), 20
).tolist()
for n, color in zip(names, ["tab:gray", "tab:blue"]):
    axes[1].hist(margins[n].tolist(), bins=bins, alpha=0.6, color=color, label=n)
axes[1].axvline(0, color="k", lw=1)
axes[1].set(xlabel="score(chosen) - score(rejected)", title="Held-out margins")
axes[1].legend()
digits = fresh["reward"]
counts = [k for k in sorted(set(digits.tolist())) if (digits == k).sum() >= 3]
for n, color in zip(names, ["tab:gray", "tab:blue"]):
    means = [fresh[RM_KEYS[n]][digits == k].mean().item() for k in counts]
    axes[2].plot(counts, means, "o-", color=color, label=n)
axes[2].set(
    xlabel="rule reward (digits in the answer)",
    ylabel="mean RM score",
    title=f"Fresh rollouts (n={len(fresh)})",
)
axes[2].legend()
fig.tight_layout()
FIGURE = OUT_DIR / "trl_interop_summary.png"
fig.savefig(FIGURE, dpi=100)
assert FIGURE.exists()

# %%
# **Close the loop (optional).** The trained reward model also goes back to TRL, as a reward
# function for ``GRPOTrainer``: :func:`~torchrl_trl_interop.as_trl_reward_func` wraps the TorchRL
# module into TRL's ``f(prompts, completions, ...)`` convention. On the fresh rollouts it returns
# exactly the scores the module wrote. A prompt dataset comes straight from the collector's
# buffer (``("history", "prompt")`` renamed ``prompt``), and two GRPO steps run on it with the
# learned reward and the rule.

from trl import GRPOConfig, GRPOTrainer

trained_rm_func = as_trl_reward_func(
    trained_rm, reward_key="rm_reward", processing_class=rm_tok, name="trained_rm"
)
prompts, completions = zip(*(split_prompt_completion(c) for c in fresh_conversations))
# ``max_batch_size=None`` scores every row in one call, as ``trained_rm(fresh)`` did, so the
# scores are the module's to the bit. By default rows are sorted by length and scored 32 at a
# time (faster: less padding), which in bfloat16 can move a score by one bfloat16 step.
same_call = as_trl_reward_func(
    trained_rm, reward_key="rm_reward", processing_class=rm_tok, max_batch_size=None
)
bridged = same_call(prompts=list(prompts), completions=list(completions), completion_ids=None)
assert torch.allclose(torch.tensor(bridged), fresh["rm_reward"], atol=1e-5)
bucketed = trained_rm_func(
    prompts=list(prompts), completions=list(completions), completion_ids=None
)
assert torch.allclose(torch.tensor(bucketed), fresh["rm_reward"], atol=2e-2)

prompt_data = TorchRLBufferDataset(
    train_rb, batch_size=64, keys=[("history", "prompt")], rename={("history", "prompt"): "prompt"}
).to_hf_dataset()
grpo = GRPOTrainer(
    model=toy_causal_lm(tokenizer=tok),
    reward_funcs=[trained_rm_func, number_reward],
    args=GRPOConfig(
        num_generations=2,
        max_completion_length=12,
        **toy_trainer_args(
            OUT_DIR / "runs", per_device_train_batch_size=4, disable_tqdm=not SHOW_PROGRESS
        ),
    ),
    train_dataset=prompt_data,
    processing_class=tok,
)
grpo.train()
logged = {k for log in grpo.state.log_history for k in log}
assert grpo.state.global_step == 2
assert {"rewards/trained_rm/mean", "rewards/number_reward/mean"} <= logged

# %%
# Summary
# -------

elapsed = time.perf_counter() - T_START
summary = [
    f"rollouts collected    : {len(rollouts_rb) + len(train_rb) + len(fresh)} "
    f"({len(train_rb)} for training, {len(fresh)} fresh, {len(rollouts_rb)} in Part 1)",
    f"preference pairs      : {len(train_pairs)} for training, {len(held_out)} held out",
    f"RM held-out accuracy  : {accuracy['untrained']:.2f} untrained -> {accuracy['trained']:.2f} trained",
    f"RM mean margin        : {margins['untrained'].mean():.3f} untrained -> "
    f"{margins['trained'].mean():.3f} trained",
    f"time                  : {elapsed:.0f} s",
    f"figure                : {FIGURE.resolve()}",
]
print("\n".join(summary))
