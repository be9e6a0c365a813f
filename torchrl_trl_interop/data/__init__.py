"""Buffers <-> TRL and Hugging Face datasets (TorchRL -> TRL, and TRL data back into buffers).

The public names live at the top level (``from torchrl_trl_interop import TorchRLBufferDataset``);
the modules here are private. What each one holds: the module table of ``docs/overview.rst``
(``test/test_layout.py`` checks that it lists every module).
"""
