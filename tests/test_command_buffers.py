"""The CUDA handlers inside XLA's command buffers (CUDA graphs).

The handlers declare themselves command-buffer compatible (handlers.cu), so
XLA captures them into its command buffers when custom calls are enabled
there. The same jitted fwd+bwd (plain causal, packed documents with a window,
dropout; default and deterministic backward; a bias gradient) runs in two
fresh processes, with custom calls in command buffers and with command
buffers off: bitwise equal but where float32 atomics add (the default dQ,
the bias gradient). Each process also runs each step three times: a command
buffer replayed gives the same bits.
"""

import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

ON_GPU = jax.default_backend() == "gpu"

_STEP = textwrap.dedent(
    """
    import sys
    import jax, jax.numpy as jnp, numpy as np, jax_flash
    rng = np.random.default_rng(0)
    b, t, n, h = 2, 512, 4, 64
    q, k, v = (jnp.asarray(rng.standard_normal((b, t, n, h)), jnp.bfloat16) for _ in range(3))
    ids = jnp.asarray(np.repeat(np.arange(4), t // 4)[None].repeat(b, 0), jnp.int32)
    bias = jnp.asarray(rng.standard_normal((1, n, t, t)), jnp.float32)
    cases = {
        "causal": dict(is_causal=True),
        "segments_window": dict(is_causal=True, q_segment_ids=ids, kv_segment_ids=ids,
                                local_window_size=(100, 0)),
        "dropout": dict(dropout_rate=0.1, dropout_rng=jax.random.key(7)),
    }
    out = {}
    for name, kw in cases.items():
        for det in (False, True):
            f = jax.jit(jax.value_and_grad(lambda q, k, v: jnp.sum(
                jax_flash.attention(q, k, v, deterministic=det, **kw).astype(jnp.float32) ** 2), (0, 1, 2)))
            runs = [jax.tree.map(np.asarray, f(q, k, v)) for _ in range(3)]
            for r in runs[1:]:
                for i, (x, y) in enumerate(zip(jax.tree.leaves(runs[0]), jax.tree.leaves(r))):
                    if det or i != 1:  # the default dQ adds by float32 atomics: any order
                        assert x.tobytes() == y.tobytes(), f"{name}: replay differs"  # bitwise (0-d loss too)
            loss, grads = runs[0]
            out[f"{name}_{'det' if det else 'default'}"] = [loss, *grads]
    g = jax.jit(jax.grad(lambda bias: jnp.sum(jax_flash.attention(q, k, v, bias=bias).astype(jnp.float32) ** 2)))
    out["bias_gradient"] = [np.asarray(g(bias))]
    # float32 on disk: exact for 16-bit values, and np.load cannot restore bfloat16 (it comes back as void).
    np.savez(sys.argv[1], **{f"{k}_{i}": np.asarray(x, np.float32) for k, xs in out.items() for i, x in enumerate(xs)})
    """
)


def _run(tmp_path, name, flags):
    script = tmp_path / "step.py"
    script.write_text(_STEP)
    env = dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " " + flags).strip())
    result = tmp_path / f"{name}.npz"
    proc = subprocess.run([sys.executable, str(script), str(result)], env=env, cwd=str(tmp_path),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return np.load(result)


@pytest.mark.skipif(not ON_GPU, reason="command buffers are a CUDA matter")
def test_command_buffers_give_the_same_bits(tmp_path):
    graphs = _run(tmp_path, "graphs",
                  "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1")
    plain = _run(tmp_path, "plain", "--xla_gpu_enable_command_buffer=")
    assert sorted(graphs.files) == sorted(plain.files)
    for key in graphs.files:
        a, b = graphs[key], plain[key]
        # The default backward adds dQ (leaf 1) and the bias gradient by
        # float32 atomics, whose order varies from run to run with or without
        # graphs: those within rounding; everything else (the deterministic
        # runs whole) bitwise.
        atomics = key.startswith("bias_gradient") or ("_default_" in key and key.endswith("_1"))
        if atomics:
            np.testing.assert_allclose(a, b, rtol=2e-2, atol=2e-2, err_msg=key)
        else:
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), key
