"""scripts/sustained_clocks.py (the back-to-back fwd+bwd loop of scripts/peer_profile.sh) on the CPU."""

import jax
import numpy as np

from jax_flash import reference
from helpers import load_script


def test_sustained_clocks_times_the_real_forward_and_backward():
    """scripts/sustained_clocks.py's loop body is attention's forward and the VJP of
    its dO: checked against float64 jax.vjp of the reference on the same inputs.
    Then the script itself with --seconds 0 (the Nsight Compute target)."""
    probe = load_script("sustained_clocks")
    shape = (1, 64, 2, 32)
    out, grads = probe.jax_wait(probe.jax_step("jax_flash", *shape, causal=True, dtype="float32")())
    forward = probe.jax_wait(probe.jax_step("jax_flash", *shape, causal=True, dtype="float32", forward_only=True)())
    np.testing.assert_array_equal(np.asarray(forward), np.asarray(out))
    rng = np.random.default_rng(0)  # the probe's inputs, in its order
    q, k, v, dout = (rng.standard_normal(shape) for _ in range(4))
    ref_out, vjp = jax.vjp(lambda q, k, v: reference.attention(q, k, v, is_causal=True), q, k, v)
    for got, want in zip((out, *grads), (ref_out, *vjp(dout))):
        np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want), rtol=2e-4, atol=2e-4)
    probe.main(["--impl", "jax_flash", "--shape", "1,64,2,64", "--seconds", "0"])
    probe.main(["--impl", "jax_flash", "--shape", "1,64,2,64", "--seconds", "0", "--forward-only"])
