"""GPU check of the package itself on CUDA, without vLLM: one command, a few minutes.

``benchmarks/gpu_check.py`` checks the vLLM paths; vLLM's wheel (about 228 MB) cannot travel to
a machine that has no registry. This script checks what runs on a bare CUDA machine with torch,
transformers, TRL, datasets, torchrl and tensordict. Nothing loads from a hub: every model and
tokenizer is a toy from :mod:`torchrl_trl_interop.testing`. Each check prints ``PASS`` or ``FAIL``
with its figures; the exit code is the number of failures.

1. **Reward model on the GPU.** ``HFRewardModelWrapper`` over a toy Llama reward model moved to
   the device, in fp32 and bf16: ``[B]`` float32 rewards on their rows' device, no inference
   tensor handed back from a caller's ``torch.inference_mode()``, ragged token rows and
   ``History`` conversations scored, ``max_batch_size`` micro-batches equal to one padded call,
   and the fp32 rewards equal to the same model's on CPU.
2. **A replay buffer stored on the GPU.** ``TorchRLBufferDataset`` over a ``LazyTensorStorage``
   on the device: rows cut to their mask, a ``PaddingCollator`` batch, and ``to_hf_dataset()``
   (a host copy) equal to the same rows stored on CPU.
3. **Weight push from the GPU.** ``StagingWeightSyncScheme`` pushes a 10M-parameter toy Llama from
   the device into a CPU copy (the receiver in a thread, as a collector worker's): weights equal
   after each push; GB/s printed.
4. **GRPO on the GPU.** A real ``GRPOTrainer`` with ``rollout_func=as_trl_rollout_func(ChatEnv)``
   (the trainer's own model generates) trains 2 steps in fp32 (``toy_grpo_args``) and 2 steps
   with ``bf16=True`` (TRL's default precision: its forwards give bf16 logits), the model on the
   device; fp32 rollouts' log-probs equal the model's own forward pass.

Run with ``python benchmarks/gpu_check_cuda.py`` (``--device cpu`` runs the same checks on CPU,
``--checks reward grpo`` a subset). See ``docs/distributed.rst``.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
import threading
import time
import traceback

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

#: (atol, rtol) between two ways of scoring the same rows, per model dtype
TOL = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (3e-2, 3e-2)}
LENGTHS = [3, 17, 5, 9, 2, 12, 7, 4]  # ragged token rows, unsorted


def _same_device(tensor: torch.Tensor, device: torch.device) -> bool:
    return tensor.device.type == device.type and (
        device.index is None or tensor.device.index == device.index
    )


def _token_rows(seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 300, (n,), generator=gen) for n in LENGTHS]


def check_reward_model(device: torch.device, root: str) -> str:
    from tensordict import TensorDict, lazy_stack

    from torchrl_trl_interop import HFRewardModelWrapper, messages_to_history
    from torchrl_trl_interop.testing import toy_chats, toy_reward_model, toy_tokenizer

    tok = toy_tokenizer()
    rows = _token_rows()

    def ragged() -> TensorDict:
        return lazy_stack(
            [
                TensorDict(
                    {"tokens": {"full": r}, "masks": {"all_attention_mask": torch.ones_like(r) > 0}}
                )
                for r in rows
            ]
        )

    cpu_model = toy_reward_model("llama", tokenizer=tok)
    reference = HFRewardModelWrapper(cpu_model, inference_mode=True)(ragged())["reward"]
    figures = []
    for dtype in (torch.float32, torch.bfloat16):
        atol, rtol = TOL[dtype]
        model = copy.deepcopy(cpu_model).to(device=device, dtype=dtype)
        one_call = HFRewardModelWrapper(model, inference_mode=True)
        with torch.inference_mode():  # a caller's inference mode: a normal tensor comes back
            scored = one_call(ragged())
        reward = scored["reward"]  # read outside: stacking lazy rows inside would make a new one
        # the reward joins its rows: CPU rows get a CPU reward, rows on the device a device one
        assert reward.device.type == "cpu", f"{dtype}: CPU rows' reward on {reward.device}"
        on_device = one_call(ragged().to(device))["reward"]
        assert _same_device(on_device, device), f"{dtype}: reward on {on_device.device}"
        torch.testing.assert_close(on_device.cpu(), reward, atol=0, rtol=0)
        assert reward.shape == (len(rows),) and reward.dtype == torch.float32, (reward.shape, dtype)
        assert not reward.is_inference(), f"{dtype}: an inference tensor was returned"
        bucketed = HFRewardModelWrapper(model, inference_mode=True, max_batch_size=3)
        buckets = bucketed(ragged())["reward"]
        torch.testing.assert_close(buckets, reward, atol=atol, rtol=rtol)
        vs_cpu = (reward.cpu() - reference).abs().max().item()
        torch.testing.assert_close(reward.cpu(), reference, atol=max(atol, 1e-4), rtol=rtol)

        chats = toy_chats(6)
        history = TensorDict({"history": {"full": messages_to_history(chats)}}, batch_size=[6])
        by_history = HFRewardModelWrapper(model, input_mode="history", tokenizer=tok)
        h_one = by_history(history.clone())["reward"]
        h_bucketed = HFRewardModelWrapper(
            model, input_mode="history", tokenizer=tok, max_batch_size=4
        )(history.clone())["reward"]
        assert _same_device(h_one, device) and h_one.shape == (6,), (h_one.device, h_one.shape)
        assert h_one.requires_grad, "inference_mode=False: the reward should carry a graph"
        torch.testing.assert_close(h_bucketed, h_one, atol=atol, rtol=rtol)
        figures.append(
            f"{str(dtype).split('.')[-1]}: buckets-vs-one {(buckets - reward).abs().max():.1e}, "
            f"vs CPU fp32 {vs_cpu:.1e}, history buckets-vs-one "
            f"{(h_bucketed - h_one).abs().max():.1e}"
        )
    return f"{len(rows)} ragged rows + 6 History rows on {device}; " + "; ".join(figures)


def _buffer(device: torch.device, ids: torch.Tensor, mask: torch.Tensor, prompts: list[str]):
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, ReplayBuffer

    n = len(ids)
    rb = ReplayBuffer(storage=LazyTensorStorage(n, device=device))
    rb.extend(
        TensorDict(
            {
                "input_ids": ids,
                "attention_mask": mask,
                "score": torch.arange(n) / 2,
                "prompt": prompts,
            },
            batch_size=[n],
        )
    )
    return rb


def check_buffer_dataset(device: torch.device, root: str) -> str:
    from torchrl_trl_interop import PaddingCollator, TorchRLBufferDataset
    from torchrl_trl_interop.testing import toy_padded

    rows = _token_rows(1)
    ids, mask = toy_padded(rows, "right", padding_value=0)
    prompts = [f"prompt {i}" for i in range(len(rows))]
    on_device = _buffer(device, ids, mask, prompts)
    on_cpu = _buffer(torch.device("cpu"), ids, mask, prompts)
    stored = on_device[:]["input_ids"]
    assert _same_device(stored, device), f"storage on {stored.device}, not {device}"

    ds = TorchRLBufferDataset(
        on_device, batch_size=3, attention_mask_key="attention_mask", epoch=True
    )
    out = list(ds)
    assert [r["prompt"] for r in out] == prompts, [r["prompt"] for r in out]
    for row, expected in zip(out, rows):
        torch.testing.assert_close(row["input_ids"].cpu(), expected)  # cut to its own length
    row_device = out[0]["input_ids"].device

    batch = PaddingCollator(pad_token_id=0)([{"input_ids": r["input_ids"]} for r in out[:4]])
    want_ids, want_mask = toy_padded(rows[:4], "right", padding_value=0)
    torch.testing.assert_close(batch["input_ids"].cpu(), want_ids)
    assert batch["attention_mask"].cpu().bool().equal(want_mask), batch["attention_mask"]

    start = time.perf_counter()
    hf = TorchRLBufferDataset(on_device, batch_size=3).to_hf_dataset()
    seconds = time.perf_counter() - start
    hf_cpu = TorchRLBufferDataset(on_cpu, batch_size=3).to_hf_dataset()
    assert hf.to_list() == hf_cpu.to_list(), "to_hf_dataset differs between GPU and CPU storage"
    assert hf.column_names == hf_cpu.column_names and len(hf) == len(rows)
    return (
        f"{len(rows)} rows stored on {stored.device}, yielded on {row_device}, cut to lengths "
        f"{[len(r['input_ids']) for r in out]}; collated {tuple(batch['input_ids'].shape)}; "
        f"to_hf_dataset {len(hf)} rows x {hf.column_names} equal to CPU's ({seconds * 1e3:.0f} ms)"
    )


class _Recorder:
    """Wraps a rollout function; keeps the largest gap between its log-probs and the model's own
    forward pass on the same ids (fp32 runs)."""

    def __init__(self, rollout_func):
        self.rollout_func, self.max_gap, self.rows = rollout_func, 0.0, 0

    def __call__(self, prompts, trainer):
        out = self.rollout_func(prompts, trainer)
        model = trainer.accelerator.unwrap_model(trainer.model)
        device = next(model.parameters()).device
        for p, c, lp in zip(out["prompt_ids"], out["completion_ids"], out["logprobs"]):
            ids = torch.tensor([p + c], device=device)
            with torch.no_grad():
                logits = model(input_ids=ids).logits[0].float() / trainer.temperature
            own = logits[len(p) - 1 : -1].log_softmax(-1)
            own = own.gather(-1, torch.tensor(c, device=device)[:, None]).squeeze(-1)
            self.max_gap = max(self.max_gap, (own.cpu() - torch.tensor(lp)).abs().max().item())
            self.rows += 1
        return out


def _grpo(device: torch.device, out_dir: str, *, bf16: bool):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from torchrl_trl_interop import as_trl_rollout_func
    from torchrl_trl_interop.testing import (
        toy_answer_length,
        toy_causal_lm,
        toy_chat_env,
        toy_grpo_args,
        toy_prompts,
        toy_tokenizer,
    )

    tok = toy_tokenizer()
    prompts = [[{"role": "user", "content": p}] for p in toy_prompts(8)]
    # toy_grpo_args trains in fp32 on the CPU (use_cpu=True, bf16=False): here the device decides
    args = toy_grpo_args(
        out_dir, tokenizer=tok, max_steps=2, use_cpu=device.type == "cpu", bf16=bf16
    )
    recorder = _Recorder(as_trl_rollout_func(toy_chat_env(tok, batch_size=2)))
    trainer = GRPOTrainer(
        model=toy_causal_lm(tokenizer=tok),
        reward_funcs=toy_answer_length,
        args=GRPOConfig(**args),
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        processing_class=tok,
        rollout_func=recorder,
    )
    model = trainer.accelerator.unwrap_model(trainer.model)
    before = [p.detach().clone() for p in model.parameters()]
    dtypes: set[torch.dtype] = set()  # the logits' dtype in every forward: bf16 under autocast
    hook = model.lm_head.register_forward_hook(lambda m, a, out: dtypes.add(out.dtype))
    try:
        trainer.train()
    finally:
        hook.remove()
    recorder.logit_dtypes = sorted(str(d).split(".")[-1] for d in dtypes)
    param = next(model.parameters())
    assert _same_device(param, device), f"trainer model on {param.device}, not {device}"
    assert trainer.state.global_step == 2, trainer.state.global_step
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters())), "no update"
    logs = [h for h in trainer.state.log_history if "loss" in h and "reward" in h]
    assert len(logs) == 2, trainer.state.log_history
    assert recorder.rows > 0
    return trainer, logs, recorder, param


def check_grpo(device: torch.device, root: str) -> str:
    figures = []
    for bf16 in (False, True):
        name = "bf16" if bf16 else "fp32"
        trainer, logs, recorder, param = _grpo(
            device, os.path.join(root, f"grpo-{name}"), bf16=bf16
        )
        if not bf16:  # bf16 autocast samples in bf16: its log-probs differ from fp32 by design
            assert recorder.max_gap < 1e-3, f"rollout log-probs vs own forward: {recorder.max_gap}"
        want = "bfloat16" if bf16 else "float32"  # bf16=True: TRL autocasts every forward
        assert want in recorder.logit_dtypes, f"no {want} forward: {recorder.logit_dtypes}"
        steps = ", ".join(
            f"loss {h['loss']:.4f} grad_norm {h['grad_norm']:.3f} reward {h['reward']:.2f}"
            for h in logs
        )
        figures.append(
            f"{name} (args.bf16={trainer.args.bf16}, weights {param.dtype} on {param.device}): "
            f"{steps}; {recorder.rows} rollouts, log-prob gap {recorder.max_gap:.1e}, "
            f"logits {recorder.logit_dtypes}"
        )
    return "2 steps each; " + "; ".join(figures)


def check_weight_push(device: torch.device, root: str) -> str:
    from torchrl_trl_interop import StagingWeightSyncScheme
    from torchrl_trl_interop.testing._weights import toy_big_llama

    trainer_model = toy_big_llama(seed=0).to(device)
    generator = toy_big_llama(seed=1)  # the CPU policy
    sender = StagingWeightSyncScheme(timeout=120)
    sender.init_on_sender(model_id="policy", model=generator)
    receiver = StagingWeightSyncScheme()
    receiver.__setstate__(sender.__getstate__())  # what a worker gets, pickled
    receiver.init_on_receiver(model_id="policy", model=generator)
    sender.connect()
    receiver.connect()
    nbytes = sum(p.numel() * p.element_size() for p in trainer_model.parameters())
    seconds = []
    for version in (1, 2, 3):
        with torch.no_grad():  # a new step's weights
            for p in trainer_model.parameters():
                p.add_(0.01)
        worker = threading.Thread(target=receiver.receive, kwargs={"timeout": 120})
        worker.start()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        assert sender.send(trainer_model, policy_version=version) == version
        worker.join(timeout=130)
        seconds.append(time.perf_counter() - start)
        assert not worker.is_alive(), "the receiver did not commit within 130 s"
        assert receiver.policy_version == version, receiver.policy_version
        got, want = generator.state_dict(), trainer_model.state_dict()
        diff = [k for k in want if not torch.equal(got[k], want[k].cpu())]
        assert not diff, f"version {version}: {len(diff)} tensors differ, e.g. {diff[:3]}"
    rates = ", ".join(f"{nbytes / s / 1e9:.2f}" for s in seconds)
    return (
        f"{nbytes / 1e6:.0f} MB ({len(list(trainer_model.parameters()))} tensors) from "
        f"{device} to CPU, 3 pushes equal; GB/s per push (send + commit): {rates}"
    )


CHECKS = {
    "reward": ("HFRewardModelWrapper on the device, fp32 and bf16", check_reward_model),
    "buffer": ("TorchRLBufferDataset over a LazyTensorStorage on the device", check_buffer_dataset),
    "push": ("StagingWeightSyncScheme push from the device into a CPU policy", check_weight_push),
    # the longest check last: a hang there leaves the others' results in the log
    "grpo": ("GRPOTrainer + as_trl_rollout_func(ChatEnv), fp32 and bf16", check_grpo),
}


def versions() -> str:
    """The versions that decide what runs (the device machine mixes its own with carried ones)."""
    import importlib.metadata as md

    names = ["torch", "torchrl", "tensordict", "transformers", "trl", "datasets", "accelerate"]
    names += ["huggingface_hub", "pyarrow", "fsspec", "tokenizers"]
    found = []
    for name in names:
        try:
            found.append(f"{name} {md.version(name)}")
        except md.PackageNotFoundError:
            found.append(f"{name} missing")
    from torchrl.data.replay_buffers.samplers import prioritized

    # torchrl's C++ extension is built against one torch; only prioritized sampling needs it
    loaded = prioritized.SumSegmentTreeFp32 is not None
    return ", ".join(found) + f"; torchrl C++ extension {'loaded' if loaded else 'not loaded'}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="where the checks run (default: cuda)")
    parser.add_argument("--checks", nargs="+", choices=list(CHECKS), default=list(CHECKS))
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_check_cuda: no CUDA device (pass --device cpu to run the checks on CPU).")
        return 1
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"gpu_check_cuda on {device} ({name}); {versions()}", flush=True)
    torch.manual_seed(0)
    failures = 0
    with tempfile.TemporaryDirectory() as root:
        for key in args.checks:
            title, check = CHECKS[key]
            start = time.perf_counter()
            try:
                detail = check(device, root)
                print(f"PASS  {title} ({time.perf_counter() - start:.1f} s): {detail}", flush=True)
            except Exception:  # noqa: BLE001 - reported, the next check still runs
                failures += 1
                print(f"FAIL  {title} ({time.perf_counter() - start:.1f} s)", flush=True)
                traceback.print_exc()
                sys.stderr.flush()
    peak = ""
    if device.type == "cuda":
        peak = f"; peak GPU memory {torch.cuda.max_memory_allocated(device) / 2**20:.0f} MiB"
    print(f"gpu_check_cuda: {len(args.checks) - failures} passed, {failures} failed{peak}")
    return failures


if __name__ == "__main__":
    sys.exit(main())
