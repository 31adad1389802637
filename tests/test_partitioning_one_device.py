"""The partitioning rules (_partitioning.py) on a mesh of one device of the
default backend: on the H200 the CUDA calls lowered through the rules (the
multi-device cases of test_sharding.py need 4 devices, which a one-GPU
machine lacks, so they run on the CPU's forced host devices only). Forward
and gradients under jit with NamedSharding inputs equal the plain call
bitwise where the kernels are deterministic, and the compiled module has no
collective."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jax_flash
from helpers import ON_GPU, assert_close, random_qkv

COLLECTIVE = re.compile(r"(all-gather|all-reduce|all-to-all|reduce-scatter|collective-permute)(?:-start)?\(")


@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "atomics"])
@pytest.mark.parametrize("kv_heads", [4, 1], ids=["mha", "mqa"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_rules_lower_on_one_device(rng, kv_heads, causal, deterministic):
    """(On the GPU the MQA case with atomics also takes the backward over
    copied key heads, _kernel_call.key_head_copies, inside the rules.)"""
    dtype = "bfloat16" if ON_GPU else "float32"
    q, k, v = random_qkv(rng, 2, 256, 256, 4, kv_heads, 64, dtype)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "heads"))
    spec = NamedSharding(mesh, P("data", None, "heads", None))
    dout = jnp.asarray(rng.standard_normal(q.shape), dtype)

    def loss(q, k, v):
        out = jax_flash.attention(q, k, v, is_causal=causal, deterministic=deterministic)
        return jnp.sum(out.astype(jnp.float32) * dout.astype(jnp.float32))

    step = jax.jit(jax.value_and_grad(loss, (0, 1, 2)))
    sharded = [jax.device_put(x, spec) for x in (q, k, v)]
    compiled = step.lower(*sharded).compile()
    assert not COLLECTIVE.search(compiled.as_text()), "a collective in a one-device mesh"
    got = compiled(*sharded)
    want = step(q, k, v)
    for name, g, w in zip(("loss", "dq", "dk", "dv"), jax.tree.leaves(got), jax.tree.leaves(want)):
        if deterministic or not ON_GPU:
            np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(w, np.float32), err_msg=name)
        else:  # dQ by float32 atomics: the order of the adds differs run to run
            assert_close(name, g, w, dtype)
