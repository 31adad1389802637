"""Inputs, float64 ground truth and dtype-relative comparisons for the tests."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess

import jax
import jax.numpy as jnp
import numpy as np

from jax_flash import reference

ON_GPU = jax.default_backend() == "gpu"
# A compute capability 9.x GPU: where the sm90 (Hopper) kernels run.
ON_HOPPER = ON_GPU and jax.devices()[0].compute_capability.startswith("9")
CPU = jax.devices("cpu")[0]

# Relative tolerance per dtype for outputs; gradients get GRAD_FACTOR times
# more (they sum over a sequence and go through dS = P * (dP - delta)).
# bf16 has 8 mantissa bits (half-ulp 2e-3), f16 11 (2.4e-4).
TOLERANCE = {
    jnp.dtype(jnp.float64): 1e-10,
    jnp.dtype(jnp.float32): 2e-5,
    jnp.dtype(jnp.float16): 2e-3,
    jnp.dtype(jnp.bfloat16): 1.2e-2,
}
GRAD_FACTOR = 2.0

FLOAT_DTYPES = ["float16", "bfloat16", "float32", "float64"]


def random_qkv(rng, batch, tq, tk, heads, kv_heads, head_dim, dtype):
    """Fresh normal inputs (never zeros) in `dtype`, on the default device."""
    shape_q = (batch, tq, heads, head_dim)
    shape_k = (batch, tk, kv_heads, head_dim)
    return tuple(
        jnp.asarray(rng.standard_normal(s), dtype=dtype) for s in (shape_q, shape_k, shape_k)
    )


def to_f64_cpu(x):
    return jax.device_put(jnp.asarray(x, jnp.float64), CPU)


def reference_f64(q, k, v, **kwargs):
    """Output and lse [B, N, T] in float64 on the CPU, from the given (rounded) inputs."""
    out, lse = reference.attention(
        to_f64_cpu(q), to_f64_cpu(k), to_f64_cpu(v), return_residual=True, **kwargs
    )
    return np.asarray(out), np.asarray(lse)


def reference_grads_f64(q, k, v, dout, **kwargs):
    """dq, dk, dv of sum(out * dout) in float64 on the CPU, through jax.grad."""

    def loss(q, k, v):
        return jnp.sum(reference.attention(q, k, v, **kwargs) * to_f64_cpu(dout))

    grads = jax.grad(loss, argnums=(0, 1, 2))(to_f64_cpu(q), to_f64_cpu(k), to_f64_cpu(v))
    return tuple(np.asarray(g) for g in grads)


def assert_close(name, actual, expected, dtype, factor=1.0):
    """Every element within tol * (max|expected| + |expected|), tol set by dtype."""
    actual = np.asarray(jnp.asarray(actual, jnp.float64))
    expected = np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, f"{name}: shape {actual.shape} != {expected.shape}"
    assert np.all(np.isfinite(actual)), f"{name}: non-finite values (unwritten or overflow)"
    tol = TOLERANCE[jnp.dtype(dtype)] * factor
    scale = max(float(np.max(np.abs(expected))), 1e-30)
    err = np.abs(actual - expected)
    bound = tol * (scale + np.abs(expected))
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert np.all(err <= bound), (
        f"{name} ({jnp.dtype(dtype).name}): max error {err.max():.3g} vs tolerance "
        f"{tol:.1g} x scale {scale:.3g}; worst at {worst}: {actual[worst]} vs {expected[worst]}"
    )


def run_host_check(tmp_path, source_name):
    """Builds tests/cpp/<source_name> with nvcc as a plain host program (with
    AddressSanitizer where the host compiler has it, so out-of-bounds reads
    fail too), runs it and returns its stdout; fails on a nonzero exit."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    exe = tmp_path / source_name.replace(".cu", "")
    compile_cmd = ["nvcc", "-std=c++17", "-O1", "-g", "--expt-relaxed-constexpr",
                   "-I", os.path.join(root, "ffi"), "-o", str(exe),
                   os.path.join(root, "tests", "cpp", source_name)]
    asan = ["-Xcompiler", "-fsanitize=address", "-lasan"]
    if subprocess.run(compile_cmd + asan, capture_output=True, text=True).returncode != 0:
        subprocess.run(compile_cmd, check=True, capture_output=True, text=True)
    run = subprocess.run([str(exe)], capture_output=True, text=True,
                         env={**os.environ, "ASAN_OPTIONS": "detect_leaks=0"})
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


def load_script(name):
    """scripts/<name>.py as a module (scripts/ is not a package)."""
    script = pathlib.Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
