"""OpenEnv both ways: TorchRL environments served as OpenEnv environments, OpenEnv environments
driven by TorchRL.

The public names live at the top level (``from torchrl_trl_interop import OpenEnvChatEnv``);
the modules here are private, one job each:

* ``_wire``: the action and observation models, the tools' JSON schemas, a client's mistakes;
* ``_errors``: the served app answers those alike over HTTP and the WebSocket;
* ``_to_openenv``: :func:`~torchrl_trl_interop.as_openenv_environment`, a TorchRL LLM
  environment as an OpenEnv ``Environment``;
* ``_sessions``: one OpenEnv session, in this process or over OpenEnv's WebSocket protocol;
* ``_from_openenv``: :class:`~torchrl_trl_interop.OpenEnvChatEnv`, OpenEnv environments as a
  TorchRL ``EnvBase`` in history mode;
* ``_capacity``: the sessions a served environment admits, over all its worker processes;
  idle ones closed; ``/health``;
* ``_serve``: :func:`~torchrl_trl_interop.openenv_app` and
  :func:`~torchrl_trl_interop.openenv_server`, OpenEnv's server around a TorchRL environment;
* ``_workers``: the command line's server, one process or ``--workers N`` behind one address;
* ``__main__``: ``python -m torchrl_trl_interop.openenv serve MODULE:make_env --port N``.
"""
