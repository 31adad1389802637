"""The source distribution builds from scratch (issue 25): an sdist made by
the project's own build backend from the files git tracks (what a fresh clone
holds), unpacked elsewhere and built into a wheel with no CUDA (the CPU
kernels: the part every machine compiles), installed into an empty folder and
imported in a fresh process, where it computes attention against jax's own.
Runs only from a source checkout with git (not from an installed wheel's
tests)."""

import os
import pathlib
import shutil
import subprocess
import sys
import tarfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(
    not (ROOT / "pyproject.toml").exists() or not (ROOT / ".git").exists() or shutil.which("git") is None,
    reason="needs the source checkout and git")

# Run in the fresh process: jax_flash from the wheel's folder, on the CPU,
# against jax.nn.dot_product_attention in float32 (causal, GQA).
_USE = """
import jax, jax.numpy as jnp, numpy as np, jax_flash
rng = np.random.default_rng(0)
q = jnp.asarray(rng.standard_normal((2, 96, 4, 32)), jnp.float32)
k, v = (jnp.asarray(rng.standard_normal((2, 80, 2, 32)), jnp.float32) for _ in range(2))
got = jax_flash.attention(q, k, v, is_causal=True)
want = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")
err = float(jnp.max(jnp.abs(got - want)))
assert err < 1e-4, err
print(jax_flash.__file__, err)
"""


def test_sdist_builds_a_working_wheel(tmp_path):
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    clone = tmp_path / "clone"
    for name in filter(None, listed.decode().split("\0")):
        source = ROOT / name
        if source.is_file():  # (a submodule is listed as a folder)
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, clone / name)

    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-c", "import sys, scikit_build_core.build as b; b.build_sdist(sys.argv[1])",
                    str(dist)], cwd=clone, check=True, capture_output=True, text=True, timeout=300)
    (sdist,) = dist.glob("*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = archive.getnames()
        # (filter: Python 3.11.4+ and 3.12; Debian's 3.11.2 lacks it)
        if hasattr(tarfile, "data_filter"):
            archive.extractall(tmp_path / "unpacked", filter="data")
        else:
            archive.extractall(tmp_path / "unpacked")
    top = names[0].split("/")[0]
    for needed in ("pyproject.toml", "CMakeLists.txt", "ffi/module.cc", "jax_flash/__init__.py", "README.md"):
        assert f"{top}/{needed}" in names, (needed, sorted(names)[:40])
    assert not any("/.peers/" in n or "/build/" in n for n in names), "the sdist carries local build or peer files"

    env = {**os.environ, "JAX_FLASH_CUDA": "OFF", "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2)}
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q",
                            "-w", str(tmp_path / "wheel"), str(tmp_path / "unpacked" / top)],
                           env=env, capture_output=True, text=True, timeout=1500)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,) = (tmp_path / "wheel").glob("jax_flash-*.whl")
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                   check=True, capture_output=True, timeout=300)

    run_env = {**os.environ, "PYTHONPATH": str(site), "JAX_PLATFORMS": "cpu"}
    run_env.pop("XLA_FLAGS", None)
    used = subprocess.run([sys.executable, "-c", _USE], cwd=tmp_path, env=run_env, capture_output=True, text=True,
                          timeout=300)
    assert used.returncode == 0, used.stdout + used.stderr
    assert used.stdout.startswith(str(site)), used.stdout  # the wheel's package, not the one installed here
