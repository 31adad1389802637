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


def register_shard_map_rules(prim) -> None:
    """Replication rules for a primitive under older jax's ``shard_map``.

    jax < 0.6.1 or so checks replication (``check_rep``) with a table of rules
    per primitive; newer jax tracks the varying manual axes in the types
    (``vma``), which the abstract eval keeps through ``aval.update``. The
    rule here is the standard one: operands are first broadcast to a common
    replication, and every result is replicated where they all are.
    """
    try:
        from jax._src import shard_map as sm  # jax >= 0.7
    except ImportError:
        try:
            from jax.experimental import shard_map as sm
        except ImportError:  # pragma: no cover
            return
    checks = getattr(sm, "_check_rules", None)
    rewrite = getattr(sm, "register_standard_rewrite", None)
    if checks is None or rewrite is None:
        return

    def check(mesh, *in_rep, **_):
        reps = [r for r in in_rep if r is not None]
        return set.intersection(*reps) if reps else set(mesh.axis_names)

    checks.setdefault(prim, check)
    rewrite(prim)
