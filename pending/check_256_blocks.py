"""Session 42: the sm90 forward's 64-key variants at head dim 256 over 5 or
more key blocks, non-causal and causal, each call twice (bit for bit?) and
every element against float64 (the bias tiles failed there, randomly:
is it theirs, or every 64-key variant's?). Also the 128 bias tiles over 8
key blocks. Prints one line per case; BAD marks a failure."""
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jax_flash
from jax_flash import _ffi, reference

rng = np.random.default_rng(7)
b, n, kh = 2, 4, 2
f64 = lambda x: np.asarray(x, np.float64)  # noqa: E731


def case(name, head_dim, t, s, dtype=jnp.bfloat16, **kw):
    q = jnp.asarray(rng.standard_normal((b, t, n, head_dim)), dtype)
    k, v = (jnp.asarray(rng.standard_normal((b, s, kh, head_dim)), dtype) for _ in range(2))
    args = dict(kw)
    bias = args.pop("bias_shape", None)
    if bias is not None:
        args["bias"] = jnp.asarray(rng.standard_normal(bias) * 2.0, args.pop("bias_dtype", dtype))
    if "mask_shape" in args:
        args["mask"] = jnp.asarray(rng.random(args.pop("mask_shape")) > 0.3)
    _ffi.record_kernels(True)
    out = np.asarray(jax_flash.attention(q, k, v, **args), np.float64)
    names = [x for x in _ffi.recorded_kernels() if "forward kernel" in x]
    _ffi.record_kernels(False)
    again = np.asarray(jax_flash.attention(q, k, v, **args), np.float64)
    if "dropout_rng" in args:
        ref_args_drop = dict(args)
        words = jax.random.bits(ref_args_drop.pop("dropout_rng"), (2,), jnp.uint32)
        args_for_ref = dict(ref_args_drop, dropout_factor=reference.dropout_factor(
            words, b, n, t, s, ref_args_drop.pop("dropout_rate")))
    else:
        args_for_ref = args
    ref_args = {key: (f64(val) if hasattr(val, "dtype") and jnp.issubdtype(val.dtype, jnp.floating) else val)
                for key, val in args_for_ref.items()}
    want = np.asarray(reference.attention(f64(q), f64(k), f64(v), **ref_args))
    err = np.abs(out - want)
    tol = 0.02 * (1 + np.abs(want))
    bad = int((err > tol).sum())
    same = np.array_equal(out, again)
    flag = "BAD" if bad or not same else "ok "
    kernel = names[0].split("kernel")[-1][:70] if names else "?"
    print(f"{flag} {name:34s} H={head_dim} T={t} S={s}: max err {err.max():.3g}, {bad} bad, same twice {same};"
          f" {kernel}", flush=True)


if sys.argv[1:] == ["tiles256"]:  # the bias tiles at 256 (ab/bias256): which key-block counts fail
    for s in (256, 320, 448, 1000, 4096):
        for rep in range(3):
            case(f"256 bf16 bias tiles c0 #{rep}", 256, 128, s, bias_shape=(1, n, 128, s))
    case("256 f16 bias tiles c0", 256, 200, 264, dtype=jnp.float16, bias_shape=(b, n, 200, 264))
    case("256 bf16 bias tiles c1", 256, 1024, 1024, bias_shape=(1, n, 1024, 1024), is_causal=True)
    case("128 bias tiles long", 128, 1024, 4096, bias_shape=(1, n, 1024, 4096))
    case("64 bias tiles long f16", 64, 1024, 4096, dtype=jnp.float16, bias_shape=(b, n, 1024, 4096))
    sys.exit(0)
for s in (264, 320, 1000):
    for causal in (False, True):
        c = dict(is_causal=causal)
        case(f"plain c{int(causal)}", 256, 128, s, **c)
        case(f"key padding mask c{int(causal)}", 256, 128, s, mask_shape=(b, 1, 1, s), **c)
        case(f"dense mask c{int(causal)}", 256, 128, s, mask_shape=(b, n, 128, s), **c)
        case(f"softcap + mask c{int(causal)}", 256, 128, s, logits_soft_cap=5.0, mask_shape=(b, 1, 128, s), **c)
        case(f"window c{int(causal)}", 256, 128, s, local_window_size=(150, 40), **c)
        case(f"dropout c{int(causal)}", 256, 128, s, dropout_rate=0.2, dropout_rng=jax.random.key(3), **c)
        case(f"dropout + key padding c{int(causal)}", 256, 128, s, dropout_rate=0.2, dropout_rng=jax.random.key(4),
             mask_shape=(b, 1, 1, s), **c)
        case(f"f32 bias c{int(causal)}", 256, 128, s, bias_shape=(1, n, 128, s), bias_dtype=jnp.float32, **c)
        case(f"bf16 bias over queries c{int(causal)}", 256, 128, s, bias_shape=(b, n, 1, s), **c)
        case(f"128 bf16 bias tiles c{int(causal)}", 128, 128, s, bias_shape=(1, n, 128, s), **c)
        case(f"64 bf16 bias tiles c{int(causal)}", 64, 128, s, bias_shape=(b, n, 128, s), **c)
case("128 bias tiles long", 128, 1024, 4096, bias_shape=(1, n, 1024, 4096))
case("128 bias tiles long f16", 128, 1024, 4096, dtype=jnp.float16, bias_shape=(b, n, 1024, 4096))
