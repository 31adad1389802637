"""Partitioning rules: how jax_flash's FFI calls split under ``jax.jit`` over a mesh.

An FFI call is opaque to XLA's partitioner: left alone, XLA gathers every
sharded operand onto every device and runs the whole call on each. Here each
call (forward, backward, bias gradient) is a JAX primitive whose lowering is a
``jax.experimental.custom_partitioning`` function, so that XLA learns which
dims may be split and then runs the kernel once per shard, on the shard:

* split: the leading (batch) dims of q, k, v and of everything that has them,
  and the heads (query heads and key heads together, along the same mesh axes,
  so GQA groups stay whole: the heads' mesh axes must divide the key heads K,
  so with one key head (MQA) the heads stay whole; the first operand sharded
  along a dim, in the order q, k, v, ..., decides its axes);
* never split: the query and key sequences (that is ring attention's job,
  through ``shard_map``) and the head dim. An operand sharded along one of
  those is resharded by XLA to what the kernel needs (an all-gather that shows
  in the HLO), and the result is exact;
* operands broadcast along a dim (a bias or mask of size 1 along batch or
  heads, the placeholders of unused features) stay whole along it: they are
  replicated over that dim's mesh axes, and the bias gradient of such a bias
  is summed over them (the one collective these rules add, as the gradient of
  a broadcast needs);
* dropout that is not shared (``dropout_broadcast=False``): the kernels key
  each (batch, head)'s random bits by its global batch and head index, and
  take no offsets, so a shard would draw another shard's bits. With dropout on
  the rules split nothing: every operand is gathered and every device runs the
  whole call (exact, not faster). Shared dropout keys by position alone and
  splits as usual. Nothing else the kernels compute depends on a global
  batch or head index: lengths, segment ids and their block summaries, masks,
  biases and the row statistics are all indexed per shard.

The rules are given three ways: a Shardy sharding rule (``sharding_rule=``,
for jax's default partitioner), the GSPMD callbacks
(``infer_sharding_from_operands``, ``propagate_user_sharding``, while jax
still has GSPMD: ``jax_use_shardy_partitioner=False``) and, under both, the
``partition`` callback, which has the final word: it names the shardings the
kernel runs on, and XLA reshards operands to them. A sharding that cannot be
read in terms of the mesh (Shardy may tile a dim by part of a mesh axis)
counts as unknown. With explicit sharding (``jax.sharding.AxisType.Explicit``
mesh axes) the primitive's abstract evaluation gives its results the same
shardings, so the types say what the partitioner does (and the custom VJP
reshards a gradient back to its primal's type where the two differ).

Inside ``shard_map`` (any manual mesh axis) and on a single device the rules
step aside: the FFI call is emitted as it is, on the values it is given (in a
``shard_map`` over some mesh axes only, XLA then runs it whole over the
others). ``vmap`` works on the primitive (its leading dims become batch dims),
before any partitioning.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.custom_partitioning import custom_partitioning
from jax.extend.core import Primitive
from jax.interpreters import batching, mlir
from jax.sharding import NamedSharding, PartitionSpec

from . import _compat

# Two of jax's internals, used as its own cuDNN attention does (no public
# spelling yet): the result shardings of explicit-sharding types, and the set
# of primitives whose lowering needs the devices (custom_partitioning's does,
# to build the mesh; jit looks for them in the jaxpr, not inside a lowering).
try:
    from jax._src.interpreters.mlir import lower_with_sharding_in_types as _annotate
except ImportError:  # pragma: no cover
    def _annotate(ctx, op, aval):
        return op
try:
    from jax._src.dispatch import prim_requires_devices_during_lowering as _needs_devices
except ImportError:  # pragma: no cover
    _needs_devices = set()
# And the parser from XLA's shardings to mesh specs: with it the callbacks read
# shardings themselves, so one the mesh cannot name (Shardy can tile a dim by
# part of a mesh axis) counts as unknown instead of failing the compile.
try:
    from jax._src.sharding_impls import parse_flatten_op_sharding as _parse_hlo_sharding
except ImportError:  # pragma: no cover
    _parse_hlo_sharding = None


# Dim roles. "b0", "b1", ...: leading (batch) dim i of q; HEADS_Q / HEADS_K:
# query / key heads (split together, along one set of mesh axes); SEQ_Q,
# SEQ_K, HEAD_DIM: never split; None: a dim of its own (size 1 or a
# placeholder), never split.
SEQ_Q, SEQ_K, HEAD_DIM, HEADS_Q, HEADS_K = "t", "s", "h", "n", "k"
_HEADS = "heads"  # the plan's key for both head roles


def lead(i: int) -> str:
    return f"b{i}"


class Roles(NamedTuple):
    """What each dim of each operand and result of one call is."""

    operands: tuple[tuple[str | None, ...], ...]
    results: tuple[tuple[str | None, ...], ...]
    # False: nothing may be split (dropout keyed by global batch/head index).
    splittable: bool = True
    # True: a result that lacks a split role is the sum over it (the bias
    # gradient of a broadcast bias), added up across those shards.
    sum_missing: bool = False


def _plan_key(role):
    if role in (HEADS_Q, HEADS_K):
        return _HEADS
    if role is not None and role.startswith("b"):
        return role
    return None


def _entry_axes(entry) -> tuple:
    if entry is None:
        return ()
    if isinstance(entry, str):
        return (entry,)
    return tuple(entry)


def _spec_entries(sharding, ndim, mesh=None):
    """A sharding's spec as ndim tuples of mesh axes (() where unsharded), or
    None where it cannot be read in terms of the mesh."""
    if isinstance(sharding, NamedSharding):
        spec = tuple(sharding.spec)
    elif sharding is not None and mesh is not None and _parse_hlo_sharding is not None:
        try:
            (spec,) = _parse_hlo_sharding(sharding._to_xla_hlo_sharding(ndim), mesh)
        except Exception:  # noqa: BLE001 (sub-axis tilings, maximal, ...)
            return None
        spec = tuple(spec)
    else:
        return None
    spec = spec + (None,) * (ndim - len(spec))
    return tuple(_entry_axes(e) for e in spec[:ndim])


def _plan(roles: Roles, shapes, specs, axis_sizes) -> dict:
    """Mesh axes for each splittable role: {"b0": ("x",), "heads": ("y",)}.

    The first operand (in order: q, k, v, ...) sharded along a role decides
    its axes; the longest leading run of them that divides every size the
    role has (for the heads: N and K, so a GQA group never straddles two
    shards) and repeats no axis already taken is kept. Roles without such
    axes stay whole.
    """
    if not roles.splittable:
        return {}
    sizes: dict[str, set] = {}
    for dims, shape in zip(roles.operands, shapes):
        for role, size in zip(dims, shape):
            key = _plan_key(role)
            if key is not None:
                sizes.setdefault(key, set()).add(size)
    plan, used = {}, set()
    for key in sorted(sizes, key=lambda k: (k == _HEADS, k)):
        axes = ()
        for dims, spec in zip(roles.operands, specs):
            if spec is None:
                continue
            for role, entry in zip(dims, spec):
                if _plan_key(role) == key and entry:
                    axes = entry
                    break
            if axes:
                break
        while axes:
            count = math.prod(axis_sizes[a] for a in axes)
            if not (set(axes) & used) and all(s % count == 0 for s in sizes[key]):
                break
            axes = axes[:-1]
        if axes:
            plan[key] = tuple(axes)
            used |= set(axes)
    return plan


def _spec(dims, plan) -> PartitionSpec:
    entries = []
    for role in dims:
        axes = plan.get(_plan_key(role), ())
        entries.append(None if not axes else axes[0] if len(axes) == 1 else tuple(axes))
    return PartitionSpec(*entries)


def _missing_axes(dims, plan) -> tuple:
    """Plan axes of roles that a result lacks (it is summed over them)."""
    present = {_plan_key(r) for r in dims}
    return tuple(a for key, axes in sorted(plan.items()) if key not in present for a in axes)


class _Op:
    """One FFI call as a primitive with partitioning rules.

    impl(static, *operands) -> tuple of results: the FFI call itself, as it
      runs on whatever values (whole arrays or shards) it is given.
    result_avals(static, *avals) -> tuple of (index of the operand whose type
      it follows, shape, dtype).
    roles(static, operand shapes) -> Roles.
    result_roles(static, result shapes) -> (the results' dim roles, splittable):
      what the results' shapes alone tell (for a user's requested sharding).
    """

    def __init__(self, name: str, impl: Callable, result_avals: Callable, roles: Callable,
                 result_roles: Callable):
        self.name = name
        self.impl = impl
        self.result_avals = result_avals
        self.roles = roles
        self.result_roles = result_roles
        self.prim = Primitive(name)
        self.prim.multiple_results = True
        _needs_devices.add(self.prim)
        _compat.register_shard_map_rules(self.prim)
        self.prim.def_impl(self._eager)
        self.prim.def_abstract_eval(self._abstract_eval)
        batching.primitive_batchers[self.prim] = self._batch
        mlir.register_lowering(self.prim, self._lowering)

        def flat_impl(static, *operands):
            return tuple(impl(static, *operands))

        self.partitioned = custom_partitioning(flat_impl, static_argnums=(0,))
        self.partitioned.def_partition(
            decode_shardings=_parse_hlo_sharding is None,
            partition=self._partition,
            infer_sharding_from_operands=self._infer,
            propagate_user_sharding=self._propagate_user,
            sharding_rule=self._shardy_rule if _compat.SHARDY_RULES else None,
        )

    def __call__(self, static, *operands):
        return tuple(self.prim.bind(*operands, static=static))

    # --- transformations -------------------------------------------------

    @functools.lru_cache(maxsize=None)
    def _jitted(self, static):
        return jax.jit(lambda *operands: self.prim.bind(*operands, static=static))

    def _eager(self, *operands, static):
        return self._jitted(static)(*operands)

    def _abstract_eval(self, *avals, static):
        shapes = [a.shape for a in avals]
        roles = self.roles(static, shapes)
        mesh = getattr(getattr(avals[0], "sharding", None), "mesh", None)
        explicit = _compat.is_explicit(mesh)
        if explicit:
            # Types carry shardings: the results get those the kernel runs on.
            specs = [_spec_entries(a.sharding, a.ndim) for a in avals]
            plan = _plan(roles, shapes, specs, dict(mesh.shape))
        out = []
        for (like, shape, dtype), dims in zip(self.result_avals(static, *avals), roles.results):
            aval = avals[like]
            if explicit:
                spec = _spec(dims, plan)
            else:
                spec = PartitionSpec(*([None] * len(shape)))
            sharding = getattr(aval, "sharding", None)  # None: older jax, no sharding in types
            extra = {}
            if isinstance(sharding, NamedSharding):
                extra["sharding"] = NamedSharding(sharding.mesh, spec)
            elif sharding is not None:
                extra["sharding"] = sharding
            # update() keeps the manual axes the value varies over (shard_map).
            out.append(
                aval.update(shape=tuple(shape), dtype=jnp.dtype(dtype), weak_type=False, **extra)
            )
        return out

    def _batch(self, args, dims, *, static):
        # Like ffi_call's vmap_method="broadcast_all": the mapped dim leads on
        # every operand, and the kernels fold it into batch.
        (size,) = {a.shape[d] for a, d in zip(args, dims) if d is not None}
        args = [
            jnp.broadcast_to(a, (size, *a.shape)) if d is None
            else jnp.moveaxis(a, d, 0)
            for a, d in zip(args, dims)
        ]
        outs = self.prim.bind(*args, static=static)
        return outs, [0] * len(outs)

    def _lowering(self, ctx, *operands, static):
        axis_context = ctx.module_context.axis_context
        manual = getattr(axis_context, "manual_axes", ())
        devices = getattr(axis_context, "device_assignment", ())
        if manual or devices is None or (devices and len(devices) == 1):
            # Inside shard_map: the call runs on the shards it is handed; on
            # one device (or none named yet) there is nothing to split.
            fn = lambda *ops: tuple(self.impl(static, *ops))  # noqa: E731
            return mlir.lower_fun(fn, multiple_results=True)(ctx, *operands)
        fn = lambda *ops: self.partitioned(static, *ops)  # noqa: E731
        outs = mlir.lower_fun(fn, multiple_results=True)(ctx, *operands)
        return [_annotate(ctx, o, a) for o, a in zip(outs, ctx.avals_out)]

    # --- partitioning callbacks -----------------------------------------

    def _shardings(self, static, mesh, arg_shapes):
        """(mesh, plan, operand shardings, result shardings, roles) for these
        operands."""
        shapes = [tuple(a.shape) for a in arg_shapes]
        roles = self.roles(static, shapes)
        if _usable(mesh):
            specs = [_spec_entries(a.sharding, len(a.shape), mesh) for a in arg_shapes]
            plan = _plan(roles, shapes, specs, dict(mesh.shape))
        else:  # no named mesh to split over: run whole
            mesh, plan = _whole_mesh(a.sharding for a in arg_shapes), {}
        args = tuple(NamedSharding(mesh, _spec(d, plan)) for d in roles.operands)
        results = tuple(NamedSharding(mesh, _spec(d, plan)) for d in roles.results)
        return mesh, plan, args, results, roles

    def _partition(self, static, mesh, arg_shapes, result_shape):
        mesh, plan, args, results, roles = self._shardings(static, mesh, arg_shapes)
        sums = [_missing_axes(d, plan) if roles.sum_missing else () for d in roles.results]
        assert roles.sum_missing or not any(sums)

        def per_shard(*operands):
            outs = tuple(self.impl(static, *operands))
            return tuple(jax.lax.psum(o, s) if s else o for o, s in zip(outs, sums))

        return mesh, per_shard, results, args

    def _infer(self, static, mesh, arg_shapes, result_shape):
        return self._shardings(static, mesh, arg_shapes)[3]

    def _propagate_user(self, static, mesh, user_shape):
        # A user asks for result shardings: offer the nearest we can produce,
        # read off the results as if they were operands of the same roles.
        user = tuple(user_shape)
        shapes = [tuple(u.shape) for u in user]
        dims, splittable = self.result_roles(static, shapes)
        roles = Roles(dims, dims, splittable)
        if _usable(mesh):
            specs = [_spec_entries(u.sharding, len(u.shape), mesh) for u in user]
            plan = _plan(roles, shapes, specs, dict(mesh.shape))
        else:
            mesh, plan = _whole_mesh(u.sharding for u in user), {}
        return tuple(NamedSharding(mesh, _spec(d, plan)) for d in dims)

    def _shardy_rule(self, static, mesh, operand_types, result_types):
        shapes = [tuple(t.shape) for t in operand_types]
        roles = self.roles(static, shapes)
        return shardy_rule(roles, shapes)


def _usable(mesh) -> bool:
    return isinstance(mesh, jax.sharding.Mesh) and not mesh.empty


def _whole_mesh(shardings):
    """A one-axis mesh over the devices of the first known sharding: without a
    named mesh (jit given shardings of no mesh) nothing is split, and every
    operand is replicated over it."""
    for s in shardings:
        if s is not None:
            return jax.sharding.Mesh(np.array(s._device_assignment), ("jax_flash_whole",))
    raise ValueError("jax_flash: no sharding to partition by")


def like_type(x, like):
    """x resharded to like's sharding where explicit-sharding types differ."""
    want = getattr(_compat.typeof(like), "sharding", None)
    have = getattr(_compat.typeof(x), "sharding", None)
    if not isinstance(want, NamedSharding) or not isinstance(have, NamedSharding):
        return x
    if not _compat.is_explicit(want.mesh) or _compat.reshard is None:
        return x
    if tuple(want.spec) == tuple(have.spec):
        return x
    return _compat.reshard(x, want)


def shardy_rule(roles: Roles, shapes):
    """The einsum-like Shardy rule of these roles: (rule string, options).

    Leading dims b0, b1, ... and the heads may be sharded; t, s, h and every
    dim of its own are need-replication factors. Query heads are the compound
    factor (k g) of the key heads k and the group g (g replicated, so a mesh
    axis on the heads splits k: GQA groups stay whole); without GQA both are
    one factor n; with one key head (MQA) the heads are not split.
    """
    heads_q = {s[d] for dims, s in zip(roles.operands, shapes) for d, r in enumerate(dims)
               if r == HEADS_Q}
    heads_k = {s[d] for dims, s in zip(roles.operands, shapes) for d, r in enumerate(dims)
               if r == HEADS_K}
    n = max(heads_q, default=1)
    k = max(heads_k, default=n)
    replicate = {SEQ_Q, SEQ_K, HEAD_DIM}
    sizes = {}
    if k == n:
        names = {HEADS_Q: "n", HEADS_K: "n"}
    elif k == 1:
        names = {HEADS_Q: "n", HEADS_K: None}
        replicate.add("n")
    else:
        names = {HEADS_Q: "(k g)", HEADS_K: "k"}
        sizes["g"] = n // k
        replicate.add("g")
    private = iter(f"p{i}" for i in range(10**6))

    def mapping(dims):
        out = []
        for role in dims:
            if role in names:
                role = names[role]
            if role is None:
                role = next(private)
                replicate.add(role)
            out.append(role)
        return " ".join(out)

    operands = [mapping(d) for d in roles.operands]
    results = [mapping(d) for d in roles.results]
    words = lambda texts: " ".join(texts).replace("(", " ").replace(")", " ").split()  # noqa: E731
    # Factors in order of first appearance: the order Shardy wants lists in.
    factors = list(dict.fromkeys(words(operands + results)))
    in_results = set(words(results))
    if not roles.splittable:
        replicate |= set(factors)
    reduction = set()
    if roles.sum_missing:
        reduction = (set(factors) - in_results) - replicate
    else:
        # A factor no result has would be a reduction; these rules never split one.
        replicate |= set(factors) - in_results
    rule = ", ".join(operands) + " -> " + ", ".join(results)
    options = dict(sizes)
    options["need_replication_factors"] = tuple(f for f in factors if f in replicate)
    if reduction:
        options["reduction_factors"] = tuple(f for f in factors if f in reduction)
    return rule, options


def op(name: str, impl: Callable, result_avals: Callable, roles: Callable,
       result_roles: Callable) -> _Op:
    return _Op(name, impl, result_avals, roles, result_roles)
