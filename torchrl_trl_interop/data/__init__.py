"""Buffers <-> TRL and Hugging Face datasets (TorchRL -> TRL, and TRL data back into buffers).

The public names live at the top level (``from torchrl_trl_interop import TorchRLBufferDataset``);
the modules here are private, one job each:

* ``_dataset``: :class:`~torchrl_trl_interop.TorchRLBufferDataset`, configuration -> iteration;
* ``_selection``: which columns a batch holds, which a call selects, under which names;
* ``_columns``: the one column walker, a sampled batch -> one classified column per key;
* ``_arrow``: walked columns as Python values and Arrow arrays for the Hugging Face views;
* ``_reader``: reading a buffer (by index, by sampling, committed rows) into named rows;
* ``_epochs``: one pass over a buffer, resumable from a row count;
* ``_sharding``: who reads which rows (workers, ranks, epochs, seeds);
* ``_processes``: reading from other processes (spawn, Ray) and its checks;
* ``_committed``: :class:`~torchrl_trl_interop.CommittedWriter`, whole rows for online readers;
* ``_hf_views``: the ``datasets`` views and their features;
* ``_collate``: :class:`~torchrl_trl_interop.PaddingCollator`;
* ``_rows``, ``_from_hf``: TRL rows -> TensorDicts -> replay buffers;
* ``_preferences``: scored rollouts -> preference pairs;
* ``_buffer_files``, ``_checkpoint``: buffers saved atomically with the trainer's checkpoints.
"""
