"""GPU check of a 16-bit bias and its gradient (issue 19; landed in session 19).

    python scripts/bias16_check.py            # correctness, then the timing table
    python scripts/bias16_check.py --quick    # correctness only
    python scripts/bias16_check.py --timing   # the timing table alone, without the output fills

Correctness: out, dq and dbias of a bf16 / f16 bias against the float64 CPU
reference, every element at the tests' dtype-relative tolerance, for the
broadcast shapes [1,1,T,S], [B,1,T,S], [1,N,T,S], [B,N,T,S], [T,S] with
causal / window / segment ids / soft cap, on the default dispatch (the
tensor-core kernels for 16-bit head dims that are multiples of 8: on Hopper
the sm90 forward, backward and bias-gradient pass since session 20) and the
generic kernels; prints PASS / FAIL per case and exits 1 on any FAIL. It also says
whether the build reads the bias as 16-bit (build_info's cuda_bias_16bit).

Timing (the issue's shape: bf16 B=4 T=S=4096 N=16 H=128, bias [1,N,T,S]
bf16, non-causal): forward, backward (dq, dk, dv), and the bias gradient
alone (grad of the bias only: the jax_flash_dbias call), medians of jitted
calls after warm-up, in TFLOP/s by the usual 4 * B * N * T * S * H per
forward (2.5x that for the backward; the dbias pass counted as the
backward's share it computes, 2 of 5 GEMMs: 1.0x). Method of
jax_flash/benchmark.py: warm-up, then the median of --iters samples.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

# Outputs filled with NaN before each call (the C++ side reads this once per
# process), so that an element a kernel fails to write shows; not for
# --timing, whose numbers would carry the fills.
if "--timing" not in sys.argv[1:]:
    os.environ.setdefault("JAX_FLASH_POISON_OUTPUTS", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

jax.config.update("jax_enable_x64", True)

import jax_flash  # noqa: E402
from jax_flash import reference  # noqa: E402

TOL = {"float16": 2e-3, "bfloat16": 1.2e-2}
CPU = jax.devices("cpu")[0]


def _f64(x):
    return jax.device_put(jnp.asarray(x, jnp.float64), CPU)


def _close(got, want, dtype, factor):
    got = np.asarray(jnp.asarray(got, jnp.float64))
    want = np.asarray(want)
    if not np.all(np.isfinite(got)):
        return False, "non-finite"
    scale = max(float(np.max(np.abs(want))), 1e-30)
    err = np.abs(got - want)
    bound = TOL[dtype] * factor * (scale + np.abs(want))
    return bool(np.all(err <= bound)), f"max err {err.max():.3g} (scale {scale:.3g})"


def correctness(rng) -> bool:
    b, t, s, n, k, h = 2, 200, 333, 4, 2, 64
    shapes = {"1x1xTxS": (1, 1, t, s), "Bx1xTxS": (b, 1, t, s), "1xNxTxS": (1, n, t, s),
              "BxNxTxS": (b, n, t, s), "TxS": (t, s)}
    ids_q = jnp.asarray(np.repeat(np.arange(3), [70, 60, 70])[None].repeat(b, 0), jnp.int32)
    ids_k = jnp.asarray(np.repeat(np.arange(3), [100, 133, 100])[None].repeat(b, 0), jnp.int32)
    combos = {
        "plain": {}, "causal": dict(is_causal=True), "window": dict(local_window_size=(64, 16)),
        "segments-causal": dict(q_segment_ids=ids_q, kv_segment_ids=ids_k, is_causal=True),
        "softcap": dict(logits_soft_cap=20.0),
    }
    ok = True
    for dtype in ("bfloat16", "float16"):
        q, kk, v = (jnp.asarray(rng.standard_normal(sh), dtype) for sh in ((b, t, n, h), (b, s, k, h), (b, s, k, h)))
        dout = jnp.asarray(rng.standard_normal(q.shape), dtype)
        for impl in (None, "generic"):
            for shape_name, shape in shapes.items():
                bias = jnp.asarray(rng.standard_normal(shape), dtype)
                for combo_name, kw in combos.items():
                    ref_kw = dict(kw)

                    def loss(fn, q, kk, v, bias, **extra):
                        return jnp.sum(fn(q, kk, v, bias, **kw, **extra).astype(jnp.float64) *
                                       jnp.asarray(dout, jnp.float64))

                    out = jax_flash.attention(q, kk, v, bias, implementation=impl, **kw)
                    dq, dbias = jax.grad(lambda q, bb: loss(jax_flash.attention, q, kk, v, bb, implementation=impl),
                                         (0, 1))(q, bias)
                    ref_out = reference.attention(_f64(q), _f64(kk), _f64(v), _f64(bias), **ref_kw)
                    ref_dq, ref_db = jax.grad(lambda q, bb: jnp.sum(reference.attention(
                        q, _f64(kk), _f64(v), bb, **ref_kw) * _f64(dout)), (0, 1))(_f64(q), _f64(bias))
                    results = [("out",) + _close(out, ref_out, dtype, 1.0),
                               ("dq",) + _close(dq, ref_dq, dtype, 2.0),
                               ("dbias",) + _close(dbias, ref_db, dtype, 2.0)]
                    dtype_ok = dbias.dtype == bias.dtype and dbias.shape == bias.shape
                    case_ok = dtype_ok and all(r[1] for r in results)
                    ok &= case_ok
                    detail = "; ".join(f"{r[0]} {r[2]}" for r in results)
                    print(f"{'PASS' if case_ok else 'FAIL'} {dtype} {impl or 'auto'} bias {shape_name} "
                          f"{combo_name}: {detail}{'' if dtype_ok else '; dbias dtype/shape wrong'}", flush=True)
    return ok


def _median_seconds(fn, *args, iters):
    jax.block_until_ready(fn(*args))
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def timing(rng, iters):
    b, t, n, h = 4, 4096, 16, 128
    dtype = jnp.bfloat16
    key = jax.random.key(0)
    kq, kk, kv, kb = jax.random.split(key, 4)
    q = jax.random.normal(kq, (b, t, n, h), dtype)
    k = jax.random.normal(kk, (b, t, n, h), dtype)
    v = jax.random.normal(kv, (b, t, n, h), dtype)
    flops = 4.0 * b * n * t * t * h
    print("| bias | fwd TFLOP/s | bwd (dq,dk,dv) TFLOP/s | dbias pass ms | dbias TFLOP/s (1.0x fwd FLOPs) |")
    print("|---|---|---|---|---|")
    for name, shape in (("[1,N,T,S] bf16", (1, n, t, t)), ("[B,1,T,S] bf16", (b, 1, t, t)),
                        ("[1,N,T,S] f32", (1, n, t, t))):
        bias_dtype = jnp.float32 if "f32" in name else dtype
        bias = jax.random.normal(kb, shape, bias_dtype)
        fwd = jax.jit(lambda q, k, v, bb: jax_flash.attention(q, k, v, bb))
        bwd = jax.jit(jax.grad(lambda q, k, v, bb: jnp.sum(jax_flash.attention(q, k, v, bb).astype(jnp.float32)),
                               (0, 1, 2)))
        dbias = jax.jit(jax.grad(lambda bb, q, k, v: jnp.sum(jax_flash.attention(q, k, v, bb).astype(jnp.float32))))
        t_fwd = _median_seconds(fwd, q, k, v, bias, iters=iters)
        t_bwd = _median_seconds(bwd, q, k, v, bias, iters=iters) - t_fwd  # grad includes its forward
        t_db = _median_seconds(dbias, bias, q, k, v, iters=iters) - t_fwd
        print(f"| {name} | {flops / t_fwd / 1e12:.1f} | {2.5 * flops / t_bwd / 1e12:.1f} | {t_db * 1e3:.2f} | "
              f"{flops / t_db / 1e12:.1f} |", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="correctness only")
    parser.add_argument("--timing", action="store_true",
                        help="the timing table only, in a process without JAX_FLASH_POISON_OUTPUTS' fills")
    parser.add_argument("--iters", type=int, default=10)
    args = parser.parse_args()
    print("build_info:", jax_flash.build_info(), "devices:", jax.devices(), flush=True)
    rng = np.random.default_rng(19)
    ok = True
    if not args.timing:
        ok = correctness(rng)
        print("correctness:", "PASS" if ok else "FAIL", flush=True)
    if not args.quick:
        if os.environ.get("JAX_FLASH_POISON_OUTPUTS", "0") not in ("", "0"):
            print("(these timings include JAX_FLASH_POISON_OUTPUTS' output fills: --timing for clean ones)")
        timing(rng, args.iters)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
