"""jax.export of jax_flash computations: serialize a jitted forward + backward,
run it in a fresh Python process (bitwise the in-process results), and the
versioned target names (a module naming another layout version fails to
compile with an error naming the target, never runs)."""

import os
import pathlib
import subprocess
import sys
import textwrap

import jax
import jax.export  # older jax does not import the submodule with jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_flash
from jax_flash import _registration
from helpers import ON_GPU

# Exported.serialize needs flatbuffers (not a jax dependency).
pytest.importorskip("flatbuffers")

B, T, D, N, K, H = 2, 24, 32, 4, 2, 8


def _model_inputs(rng):
    """(params, x, key padding [B, S], segment ids [B, T]) of a one-layer attention model."""
    w = lambda *shape: jnp.asarray(rng.standard_normal(shape) / np.sqrt(shape[0]), jnp.float32)
    params = dict(wq=w(D, N * H), wk=w(D, K * H), wv=w(D, K * H), wo=w(N * H, D),
                  bias=jnp.asarray(0.1 * rng.standard_normal((1, N, T, T)), jnp.float32))
    x = jnp.asarray(rng.standard_normal((B, T, D)), jnp.float32)
    keep = jnp.asarray(np.arange(T)[None, :] < np.array([[T], [T - 5]]))  # 5 padded keys in row 1
    seg = jnp.asarray([[0] * 10 + [1] * 14, [0] * 7 + [1] * 9 + [2] * 8], jnp.int32)
    return params, x, keep, seg


def _loss(params, x, keep, seg):
    q = (x @ params["wq"]).reshape(B, T, N, H)
    k = (x @ params["wk"]).reshape(B, T, K, H)
    v = (x @ params["wv"]).reshape(B, T, K, H)
    o = jax_flash.attention(q, k, v, params["bias"], keep[:, None, None, :], is_causal=True,
                            q_segment_ids=seg, kv_segment_ids=seg)
    y = o.reshape(B, T, N * H) @ params["wo"]
    return jnp.mean(jnp.where(keep[..., None], y, 0.0) ** 2)


STEP = jax.jit(jax.value_and_grad(_loss))


def _export(fn, *args):
    return jax.export.export(fn, disabled_checks=_registration.export_safety_checks())(*args)


def _assert_same(got, want, what):
    """Bitwise on the CPU (its kernels are deterministic); on a GPU the
    gradient of this broadcast bias is summed with atomics, so to rounding."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, what
    if ON_GPU:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7, err_msg=what)
    else:
        assert got.tobytes() == want.tobytes(), f"{what}: not bitwise equal"


# Runs in a fresh interpreter: imports jax_flash (registering the targets),
# deserializes the module and runs it on the saved inputs.
_RUNNER = textwrap.dedent("""
    import sys
    import jax
    import jax.export
    import numpy as np
    import jax_flash  # registers the FFI targets the module calls

    module, inputs, outputs = sys.argv[1:]
    with open(module, "rb") as f:
        exp = jax.export.deserialize(bytearray(f.read()))
    saved = np.load(inputs)
    leaves = [saved[f"arg{i}"] for i in range(len(saved.files))]
    args, kwargs = jax.tree.unflatten(exp.in_tree, leaves)
    result = exp.call(*args, **kwargs)
    np.savez(outputs, **{f"out{i}": np.asarray(x) for i, x in enumerate(jax.tree.leaves(result))})
""")


def test_exported_step_runs_bitwise_in_a_fresh_process(rng, tmp_path):
    args = _model_inputs(rng)
    want = STEP(*args)
    exp = _export(STEP, *args)
    text = exp.mlir_module()
    for target in _registration.ATTENTION_TARGETS:  # forward, backward and the bias gradient
        assert f"@{target}(" in text, target

    # In process: the deserialized module gives the jitted function's bits.
    again = jax.export.deserialize(exp.serialize())
    for i, (got, ref) in enumerate(zip(jax.tree.leaves(again.call(*args)), jax.tree.leaves(want))):
        _assert_same(got, ref, f"output leaf {i}, deserialized in process")

    module, inputs, outputs = tmp_path / "step.jax", tmp_path / "in.npz", tmp_path / "out.npz"
    module.write_bytes(exp.serialize())
    np.savez(inputs, **{f"arg{i}": np.asarray(x) for i, x in enumerate(jax.tree.leaves(args))})
    runner = tmp_path / "runner.py"
    runner.write_text(_RUNNER)
    run = subprocess.run([sys.executable, str(runner), str(module), str(inputs), str(outputs)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    saved = np.load(outputs)
    got = [saved[f"out{i}"] for i in range(len(saved.files))]
    ref = jax.tree.leaves(want)
    assert len(got) == len(ref)
    for i, (g, r) in enumerate(zip(got, ref)):
        _assert_same(g, r, f"output leaf {i}, in the fresh process")
    assert np.all(np.isfinite(np.asarray(want[0])))

    # Without `import jax_flash` the targets are unknown: a clear error, no result.
    runner.write_text(_RUNNER.replace("import jax_flash ", "# import jax_flash "))
    run = subprocess.run([sys.executable, str(runner), str(module), str(inputs), str(outputs)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode != 0 and _registration.FWD_TARGET in run.stderr, run.stderr[-2000:]


def test_export_without_disabled_checks_names_the_target(rng):
    """jax.export's default refusal, which export_safety_checks() lifts."""
    q = jnp.asarray(rng.standard_normal((1, 8, 2, 4)), jnp.float32)
    with pytest.raises(ValueError, match=_registration.FWD_TARGET):
        jax.export.export(jax.jit(jax_flash.attention))(q, q, q)
    checks = _registration.export_safety_checks()
    assert checks == [jax.export.DisabledSafetyCheck.custom_call(t) for t in _registration.TARGETS]


def test_target_names_carry_the_abi_version():
    version = f"_v{_registration.ABI_VERSION}"
    assert _registration.TARGETS == tuple(
        f"jax_flash_{op}{version}" for op in ("fwd", "bwd", "dbias", "paged_fwd"))
    assert sorted(_registration._ext.cpu_targets()) == sorted(_registration.TARGETS)
    cuda = _registration._ext.cuda_targets()  # empty in a build without CUDA
    assert not cuda or sorted(cuda) == sorted(_registration.TARGETS)


def _grad_of_attention_with_bias(rng):
    q = jnp.asarray(rng.standard_normal((1, 8, 2, 4)), jnp.float32)
    bias = jnp.zeros((1, 2, 8, 8), jnp.float32)
    fn = jax.jit(jax.grad(lambda q, b: jnp.sum(jax_flash.attention(q, q, q, b) ** 2), (0, 1)))
    return fn, (q, bias)


@pytest.mark.parametrize("target", _registration.ATTENTION_TARGETS)
def test_module_of_another_layout_version_fails_naming_the_target(rng, target):
    """A module exported against another layout (here: this one's bytes with
    one target renamed to the previous version) must not run: the error names
    the missing target."""
    fn, args = _grad_of_attention_with_bias(rng)
    blob = bytes(_export(fn, *args).serialize())
    old = target.replace(f"_v{_registration.ABI_VERSION}", f"_v{_registration.ABI_VERSION - 1}")
    assert len(old) == len(target) and target.encode() in blob
    stale = jax.export.deserialize(bytearray(blob.replace(target.encode(), old.encode())))
    assert f"@{old}(" in stale.mlir_module()
    with pytest.raises(Exception, match=old) as info:
        jax.block_until_ready(stale.call(*args))
    assert "registered" in str(info.value).lower()


def test_module_with_the_unversioned_names_fails(rng):
    """What an export from before the versioned names calls: "jax_flash_fwd"."""
    q = jnp.asarray(rng.standard_normal((1, 8, 2, 4)), jnp.float32)
    call = jax.ffi.ffi_call("jax_flash_fwd", jax.ShapeDtypeStruct(q.shape, q.dtype))
    exp = jax.export.export(jax.jit(lambda q: call(q, q, q)), disabled_checks=[
        jax.export.DisabledSafetyCheck.custom_call("jax_flash_fwd")])(q)
    with pytest.raises(Exception, match="jax_flash_fwd"):
        jax.block_until_ready(jax.export.deserialize(exp.serialize()).call(q))


def test_export_for_cpu_and_cuda_runs_on_the_cpu(rng):
    """A two-platform export (made on a machine without a GPU) carries the
    backward's platform switch and runs here like the jitted function."""
    args = _model_inputs(rng)
    exp = jax.export.export(STEP, platforms=("cpu", "cuda"),
                            disabled_checks=_registration.export_safety_checks())(*args)
    assert exp.platforms == ("cpu", "cuda")
    got = jax.export.deserialize(exp.serialize()).call(*args)
    for g, r in zip(jax.tree.leaves(got), jax.tree.leaves(STEP(*args))):
        np.testing.assert_allclose(g, r, rtol=1e-6, atol=1e-7)
