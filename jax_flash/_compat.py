"""Spellings that differ across the supported jax range (see README, "Supported jax").

Each name is the newest jax's API where it exists, else its older equivalent,
else a stand-in that turns the feature off (explicit sharding needs a jax with
``jax.sharding.AxisType``; older ones never give avals a sharding).
"""

from __future__ import annotations

import jax

try:
    typeof = jax.typeof  # jax >= 0.6
except AttributeError:  # pragma: no cover (older jax)
    from jax.core import get_aval as typeof  # noqa: F401

AxisType = getattr(jax.sharding, "AxisType", None)

try:
    reshard = jax.sharding.reshard  # jax >= 0.7
except AttributeError:  # pragma: no cover
    try:
        from jax.experimental.shard import reshard  # noqa: F401
    except ImportError:
        reshard = None


def is_explicit(mesh) -> bool:
    """Whether any axis of this mesh is an explicit-sharding one."""
    if AxisType is None or mesh is None:
        return False
    return any(t == AxisType.Explicit for t in getattr(mesh, "axis_types", ()) or ())
