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
    import importlib

    for name in ("jax._src.shard_map", "jax.experimental.shard_map"):
        try:
            sm = importlib.import_module(name)
        except ImportError:
            continue
        checks = getattr(sm, "_check_rules", None)
        rewrite = getattr(sm, "register_standard_rewrite", None)
        if checks is not None and rewrite is not None:
            break
    else:  # pragma: no cover
        return

    def check(mesh, *in_rep, **_):
        reps = [r for r in in_rep if r is not None]
        return set.intersection(*reps) if reps else set(mesh.axis_names)

    checks.setdefault(prim, check)
    rewrite(prim)


def _shardy_rules_supported() -> bool:
    """Whether custom_partitioning takes the rules _partitioning gives Shardy:
    a callable returning (rule, options) with need-replication factors (jax
    0.5.x takes only a fixed rule, decided at definition time; 0.6.x a callable
    without options)."""
    try:
        import inspect

        from jax._src.custom_partitioning_sharding_rule import SdyShardingRule
    except ImportError:  # pragma: no cover
        return False
    return "need_replication_factors" in inspect.signature(SdyShardingRule).parameters


# False: under the Shardy partitioner (opt-in before jax 0.7) the calls run
# whole (their operands gathered): the results are right, the split is lost.
SHARDY_RULES = _shardy_rules_supported()


def vary_like(x, like, varying_axes):
    """x marked as varying over the manual mesh axes ``like`` varies over
    (``varying_axes(v)``: a frozenset, or None where jax does not track them).

    For a ``lax.cond`` branch that returns fresh zeros beside one that returns
    kernel results: jax 0.6's cond requires the branches' varying axes to
    match; newer jax casts them itself. ``lax.pcast(..., to="varying")`` where
    it exists (jax >= 0.8), else ``lax.pvary``.
    """
    want, have = varying_axes(like), varying_axes(x)
    if want is None or have is None:
        return x
    missing = tuple(sorted(want - have))
    if not missing:
        return x
    lax = jax.lax
    if hasattr(lax, "pcast"):
        return lax.pcast(x, missing, to="varying")
    if hasattr(lax, "pvary"):
        return lax.pvary(x, missing)
    return x  # pragma: no cover
