"""Draws the three layouts of "generation apart from training" (docs/remote.rst).

Run by ``docs/conf.py`` at every build (the PNG is not committed), or by hand:
``python docs/diagram_remote.py out.png``.
"""

from __future__ import annotations

import sys

LAYOUTS = [
    (
        "1. Same process",
        [("GRPOTrainer\n+ as_trl_rollout_func(env)\n(trainer's model generates)", 0.5, "#dbe9f6")],
        [],
        "staleness 0: the trainer's own model samples",
    ),
    (
        "2. Another process / Ray actor",
        [
            ("GRPOTrainer\n+ as_trl_rollout_func(env,\n  policy=RemotePolicy)", 0.25, "#dbe9f6"),
            ("generator process\ntorchrl policy\n(TransformersWrapper, vLLM)", 0.75, "#e4f2dc"),
        ],
        [
            (0.25, 0.75, 0.74, "prompts (TensorDicts)"),
            (0.75, 0.25, 0.56, "tokens, log-probs, policy_version"),
            (0.25, 0.75, 0.38, "WeightSyncCallback\n(shared-memory staging buffer)"),
        ],
        "staleness <= every_n_steps - 1, refused above max_staleness",
    ),
    (
        "3. AsyncGRPO / collectors apart",
        [
            (
                "trainer\n(AsyncGRPOTrainer or a\nGRPO loop) reads\nTorchRLRolloutWorker",
                0.2,
                "#dbe9f6",
            ),
            ("RayReplayBuffer\n(or a queue)", 0.5, "#f6efd9"),
            ("LLMCollector(s)\nin Ray actors\nPolicyVersion", 0.8, "#e4f2dc"),
        ],
        [
            (0.8, 0.5, 0.6, "rollouts"),
            (0.5, 0.2, 0.6, "groups"),
            (0.2, 0.8, 0.2, "weights: TorchRLWeightTransfer / WeightSyncCallback"),
        ],
        "groups older than max_staleness dropped; overlap of generation and training",
    ),
]


def draw(path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    fig, axes = plt.subplots(len(LAYOUTS), 1, figsize=(9, 8.4))
    for ax, (title, boxes, arrows, note) in zip(axes, LAYOUTS):
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.axis("off")
        ax.set_title(title, loc="left", fontsize=11, fontweight="bold")
        width = {1: 0.5, 2: 0.3, 3: 0.2}[len(boxes)]
        for label, x, color in boxes:
            ax.add_patch(
                FancyBboxPatch(
                    (x - width / 2, 0.3),
                    width,
                    0.6,
                    boxstyle="round,pad=0.01",
                    facecolor=color,
                    edgecolor="#444444",
                )
            )
            ax.text(x, 0.6, label, ha="center", va="center", fontsize=8.5)
        for start, end, y, label in arrows:
            edge = width / 2 if y >= 0.3 else 0.0  # below the boxes: from centre to centre
            x0, x1 = (start + edge, end - edge) if end > start else (start - edge, end + edge)
            if not edge:
                for x in (start, end):
                    ax.plot([x, x], [0.3, y], color="black", lw=1.2)
            ax.add_patch(
                FancyArrowPatch((x0, y), (x1, y), arrowstyle="-|>", mutation_scale=12, lw=1.2)
            )
            ax.text((x0 + x1) / 2, y + 0.04, label, ha="center", va="bottom", fontsize=7)
        ax.text(0.0, 0.0, note, fontsize=8.5, style="italic", color="#333333")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    print(draw(sys.argv[1] if len(sys.argv) > 1 else "remote_layouts.png"))
