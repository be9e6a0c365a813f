"""The one door to other libraries' internals: torchrl's and tensordict's private attributes.

Where a measured speed-up or a missing hook makes the package reach into torchrl or tensordict,
the reach lives in a module of this folder, never elsewhere. Each such path:

* is gated on the versions it was measured on (:func:`measured_on`), with the plain upstream
  call as its other branch, so another torchrl or tensordict runs the public API instead of
  reading attributes that may have moved;
* is tested on both branches (:func:`plain_upstream` forces the other one);
* names, in its docstring, what upstream would have to offer for it to be retired.

``test/test_layout.py`` checks that private attributes of torchrl and tensordict are read only
here, and which module owns which internal.
"""

from __future__ import annotations

from ._gate import TENSORDICT_MEASURED, TORCHRL_MEASURED, measured_on, plain_upstream, use_fast

__all__ = ["TENSORDICT_MEASURED", "TORCHRL_MEASURED", "measured_on", "plain_upstream", "use_fast"]
