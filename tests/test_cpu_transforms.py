"""Dropout's random layout and the CPU's soft cap.

Dropout: one Philox4x32 call (7 rounds) serves rows i0 and i0 + 8 against keys j0,
j0 + 8, j0 + 16, j0 + 24, 16 bits per pair (mask_policy.h). DropoutPolicy (what the CUDA kernels call) is
checked on the host against Random123's known answers and against
reference.dropout_factor; the CPU kernels' factors are read back exactly
through jax_flash.attention (forward and backward); the reference's layout
gets a statistical check. Soft cap: the CPU's vectorized float32 tanh (and
float64's libm one) against the float64 reference, where tanh saturates and
where it is near 0, forward and gradients.
"""

import os
import shutil
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_flash
from jax_flash import reference
from helpers import GRAD_FACTOR, assert_close, random_qkv, to_f64_cpu

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Prints Philox4x32 of Random123's known-answer inputs (10 rounds, then
# dropout's 7), then per (shared, b,
# h, i) one row of DropoutPolicy::Factor over keys 0..S-1 and one of the same
# keys from KeepBits8 (the tensor-core kernels' calls). Under nvcc a kernel (never launched) makes the policy
# compile for the device as well.
_POLICY_PROGRAM = r"""
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "common/mask_policy.h"

using namespace jax_flash;

#ifdef __CUDACC__
__global__ void DeviceBuild(DropoutPolicy d, float* out) {
  const uint32_t keep = d.KeepBits8(0, 1, threadIdx.x % 8, 32 * blockIdx.x + threadIdx.x % 8);
  out[threadIdx.x] = float(keep) + d.Factor(0, 1, threadIdx.x, threadIdx.x);
}
#endif

int main(int argc, char** argv) {
  const uint32_t kat[3][6] = {{0, 0, 0, 0, 0, 0},
                              {~0u, ~0u, ~0u, ~0u, ~0u, ~0u},
                              {0xa4093822u, 0x299f31d0u, 0x243f6a88u, 0x85a308d3u, 0x13198a2eu,
                               0x03707344u}};  // key, then counter
  for (const auto& v : kat) {
    const Philox4x32Words w = Philox4x32<10>(v[0], v[1], v[2], v[3], v[4], v[5]);
    std::printf("%08x %08x %08x %08x\n", w.w[0], w.w[1], w.w[2], w.w[3]);
  }
  for (const auto& v : kat) {
    const Philox4x32Words w = Philox4x32(v[0], v[1], v[2], v[3], v[4], v[5]);
    std::printf("%08x %08x %08x %08x\n", w.w[0], w.w[1], w.w[2], w.w[3]);
  }
  const uint32_t seed[2] = {uint32_t(std::strtoul(argv[1], nullptr, 10)),
                            uint32_t(std::strtoul(argv[2], nullptr, 10))};
  AttentionParams p;
  p.features.dropout_rate = std::atof(argv[3]);
  p.features.dropout_seed = seed;
  const int b_n = std::atoi(argv[4]), h_n = std::atoi(argv[5]), t_n = std::atoi(argv[6]),
            s_n = std::atoi(argv[7]);
  p.shape.batch = b_n;
  std::vector<float> row((s_n + 31) / 32 * 32);  // whole 32-key runs
  for (int shared = 0; shared < 2; ++shared) {
    p.features.dropout_shared = shared;
    for (int b = 0; b < b_n; ++b) {
      const DropoutPolicy d = DropoutPolicy::For(p, b);
      for (int h = 0; h < h_n; ++h)
        for (int i = 0; i < t_n; ++i) {
          for (int j = 0; j < s_n; ++j) std::printf("%.9g ", d.Factor(b, h, i, j));
          std::printf("\n");
          const int i0 = i / 16 * 16 + i % 8, half = i % 16 / 8;  // the call's first row
          for (int j0 = 0; j0 < int(row.size()); j0 += j0 % 32 == 7 ? 25 : 1) {  // lanes 0-7 of each run
            const uint32_t keep = d.KeepBits8(b, h, i0, j0);
            for (int w = 0; w < 4; ++w) row[j0 + 8 * w] = keep >> (w + 4 * half) & 1u ? d.keep_scale : 0.0f;
          }
          for (int j = 0; j < s_n; ++j) std::printf("%.9g ", row[j]);
          std::printf("\n");
        }
    }
  }
}
"""


# Random123's published Philox4x32 outputs (its kat_vectors file) for the
# inputs above: 10 rounds, then 7 (dropout's, kPhiloxRounds).
_KNOWN_ANSWERS = [
    "6627e8d5 e169c58d bc57ac4c 9b00dbd8",
    "408f276d 41c83b0e a20bc7c6 6d5451fd",
    "d16cfe09 94fdcceb 5001e420 24126ea1",
    "5f6fb709 0d893f64 4f121f81 4f730a48",
    "5207ddc2 45165e59 4d8ee751 8c52f662",
    "4dfccaba 190a87f0 c47362ba b6b5242a",
]


def _build_policy_program(tmp_path):
    """The program above, by nvcc (as CUDA: host and device) or else g++."""
    src = tmp_path / "dropout_policy.cu"
    src.write_text(_POLICY_PROGRAM)
    exe = tmp_path / "dropout_policy"
    if shutil.which("nvcc"):
        cmd = ["nvcc", "-std=c++17", "--expt-relaxed-constexpr"]
    elif shutil.which("g++"):
        cmd = ["g++", "-std=c++17", "-x", "c++"]
    else:
        pytest.skip("needs nvcc or g++")
    subprocess.run(cmd + ["-O1", "-I", os.path.join(_ROOT, "ffi"), "-o", str(exe), str(src)],
                   check=True, capture_output=True, text=True)
    return exe


def test_dropout_policy_matches_reference_on_the_host(tmp_path):
    """Philox4x32 returns all four words (known answers); DropoutPolicy's
    Factor and KeepBits8 give reference.dropout_factor's values, with and
    without sharing over (batch, head), across partial 32-key runs and both
    row halves of a call (rows 0-7 / 8-15) and a partial 16-row group."""
    exe = _build_policy_program(tmp_path)
    seed, rate, (b, n, t, s) = (123456789, 987654321), 0.3, (2, 3, 20, 75)
    lines = subprocess.run([str(exe), *map(str, seed), str(rate), *map(str, (b, n, t, s))],
                           check=True, capture_output=True, text=True).stdout.splitlines()
    assert lines[:6] == _KNOWN_ANSWERS
    rows = np.array([line.split() for line in lines[6:]], np.float32).reshape(2, b, n, t, 2, s)
    for shared in (False, True):
        want = np.float32(reference.dropout_factor(np.array(seed, np.uint32), b, n, t, s, rate, shared))
        np.testing.assert_array_equal(rows[int(shared), ..., 0, :], want, err_msg="Factor")
        np.testing.assert_array_equal(rows[int(shared), ..., 1, :], want, err_msg="KeepBits8")


def _seed_words(key):
    return jax.random.bits(key, (2,), jnp.uint32)


@pytest.mark.parametrize("shared", [False, True], ids=["per_head", "shared"])
def test_cpu_dropout_factors_exactly(shared):
    """The CPU kernels' factors, read back: with q = 0 every logit is 0, so
    with V = identity out[i, j] = P[i, j] * factor = factor / S, and with
    dO = identity the backward's dV[j, i] is the same (its factors are
    regenerated, not stored). Two query and two key blocks, the second key
    block a partial 32-key run, GQA."""
    b, t, s, n, kh = 2, 70, 80, 4, 2
    h = 80  # >= s and >= t: room for both identities
    key = jax.random.key(7)
    want = reference.dropout_factor(_seed_words(key), b, n, t, s, 0.3, shared)
    q = jnp.zeros((b, t, n, h), jnp.float32)
    k = jnp.asarray(np.random.default_rng(0).standard_normal((b, s, kh, h)), jnp.float32)
    v = jnp.broadcast_to(jnp.eye(s, h, dtype=jnp.float32)[None, :, None, :], (b, s, kh, h))
    dout = jnp.broadcast_to(jnp.eye(t, h, dtype=jnp.float32)[None, :, None, :], (b, t, n, h))
    attend = lambda q, k, v: jax_flash.attention(q, k, v, dropout_rate=0.3, dropout_rng=key,
                                                 dropout_broadcast=shared)
    out, vjp = jax.vjp(attend, q, k, v)
    got = np.moveaxis(np.asarray(out[..., :s]), 1, 2) * s  # [b, n, t, s]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)  # atol 0: dropped ones exactly 0
    dv = np.asarray(vjp(dout)[2])  # [b, s, kh, h]: each key head sums its group's query heads
    want_dv = want.reshape(b, kh, n // kh, t, s).sum(2) / s  # [b, kh, t, s]
    np.testing.assert_allclose(np.moveaxis(dv[..., :t], (1, 3), (3, 2)), want_dv, rtol=1e-6,
                               atol=1e-7)


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_reference_layout_statistics(rate):
    """The keep rate is 1 - rate overall and at each word position of a
    call, and the four keys of one call are kept independently (the joint
    keep rate of words (w1, w2) is (1 - rate)^2, of all four (1 - rate)^4):
    no word is a copy or complement of another. 2 * 128 rows of 256 keys:
    16384 calls, the bounds ~5 standard deviations."""
    b, n, t, s = 1, 2, 128, 256
    kept = reference.dropout_factor(np.array([2024, 7], np.uint32), b, n, t, s, rate) > 0
    # [calls, 4]: word w of a call is key run * 32 + 8 * w + lane.
    words = kept.reshape(b, n, t, s // 32, 4, 8).swapaxes(-1, -2).reshape(-1, 4)
    p = 1 - rate
    assert abs(kept.mean() - p) < 0.01
    np.testing.assert_allclose(words.mean(0), p, atol=0.02)
    for w1 in range(4):
        for w2 in range(w1 + 1, 4):
            assert abs((words[:, w1] & words[:, w2]).mean() - p * p) < 0.02, (w1, w2)
    assert abs(words.all(1).mean() - p**4) < 0.02


def test_reference_shared_mask_is_that_of_batch_and_head_zero():
    seed = np.array([5, 6], np.uint32)
    shared = reference.dropout_factor(seed, 2, 3, 10, 40, 0.4, shared=True)
    own = reference.dropout_factor(seed, 2, 3, 10, 40, 0.4)
    np.testing.assert_array_equal(shared, np.broadcast_to(own[:1, :1], shared.shape))
    assert not np.array_equal(own[0, 0], own[1, 2])


def _softcap_inputs(rng, dtype, logit_std):
    """q, k, v whose logits scale * q.k have standard deviation ~logit_std
    (q scaled), two query and two key blocks with partial tails, GQA."""
    q, k, v = random_qkv(rng, 1, 100, 90, 4, 2, 32, "float64")
    return (jnp.asarray(q * logit_std, dtype), jnp.asarray(k, dtype), jnp.asarray(v, dtype))


@pytest.mark.parametrize("with_bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("regime", ["saturated", "near_zero"])
def test_softcap_forward_and_gradients(rng, regime, dtype, with_bias):
    """Saturated: |logits| up to ~5x the cap, where tanh is +-1 to float
    precision and its derivative vanishes. Near zero: a cap of 1000 over
    logits of a few units, tanh arguments ~1e-3 where 1 - 2 / (e^2x + 1)
    would lose all but a few bits (and the cap multiplies that error back
    up: the output would miss float32's tolerance)."""
    with jax.default_device(jax.devices("cpu")[0]):  # the CPU's kernels, on a GPU machine too
        _check_softcap(rng, regime, dtype, with_bias)


def _check_softcap(rng, regime, dtype, with_bias):
    cap, logit_std = {"saturated": (2.0, 4.0), "near_zero": (1000.0, 2.0)}[regime]
    q, k, v = _softcap_inputs(rng, dtype, logit_std)
    logits = np.einsum("btnh,bsnh->bnts", np.asarray(q, np.float64),
                       np.repeat(np.asarray(k, np.float64), 2, axis=2)) / np.sqrt(32)
    if regime == "saturated":
        assert np.abs(logits).max() > 4 * cap
    else:
        assert np.abs(logits).max() / cap < 0.03
    bias = jnp.asarray(rng.standard_normal((1, 4, 100, 90)), dtype) if with_bias else None
    dout = jnp.asarray(rng.standard_normal(q.shape), dtype)
    f64 = lambda x: None if x is None else to_f64_cpu(x)
    out = jax_flash.attention(q, k, v, bias, logits_soft_cap=cap)
    assert_close("out", out, reference.attention(f64(q), f64(k), f64(v), f64(bias),
                                                 logits_soft_cap=cap), dtype)
    argnums = (0, 1, 2, 3) if with_bias else (0, 1, 2)
    grads = jax.grad(lambda *a: jnp.sum(jax_flash.attention(*a, logits_soft_cap=cap) * dout),
                     argnums)(q, k, v, bias)
    want = jax.grad(lambda *a: jnp.sum(reference.attention(*a, logits_soft_cap=cap) * f64(dout)),
                    argnums)(f64(q), f64(k), f64(v), f64(bias))
    for name, g, r in zip(("dq", "dk", "dv", "dbias"), grads, want):
        assert_close(name, g, r, dtype, factor=GRAD_FACTOR)
