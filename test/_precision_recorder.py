"""Runs a script with every ``TrainingArguments`` it builds recorded: ``python _precision_recorder.py
OUT.json SCRIPT``.

TRL's configs (``SFTConfig``, ``RewardConfig``, ``GRPOConfig``, ...) subclass transformers'
``TrainingArguments`` and resolve their ``bf16`` default before calling its ``__post_init__``;
this wrapper records each one's class and mixed-precision flags there, then writes them to
``OUT.json`` when the script ends (whatever its exit code), so a test can check that nothing the
script trained autocasts.
"""

from __future__ import annotations

import atexit
import json
import runpy
import sys


def main() -> None:
    out, script = sys.argv[1], sys.argv[2]
    from transformers import TrainingArguments

    seen: list[dict] = []
    original = TrainingArguments.__post_init__

    def recorded(self):
        original(self)
        seen.append({"config": type(self).__name__, "bf16": self.bf16, "fp16": self.fp16})

    TrainingArguments.__post_init__ = recorded
    atexit.register(lambda: open(out, "w").write(json.dumps(seen)))
    sys.argv = [script, *sys.argv[3:]]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
