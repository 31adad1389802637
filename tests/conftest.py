"""Test configuration shared by every test module.

Set before jax is imported: four host devices (pmap/shard_map tests on the
CPU), float64 enabled (the ground truth), output poisoning so any element
a kernel forgets to write is NaN and fails the comparison, and under
pytest-xdist no GPU memory preallocation (the workers share the GPU).
"""

import os
import sys

# Import the installed jax_flash, never the source tree (it has no compiled
# extension): `python -m pytest` from the repository root would put it first.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _ROOT]

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
).strip()
os.environ.setdefault("JAX_FLASH_POISON_OUTPUTS", "1")
# pytest-xdist workers share one GPU: each would otherwise preallocate 75% of
# its memory, the later ones fail to start a GPU backend and fall back to the
# CPU, and their differing parametrizations (ON_GPU, ON_HOPPER) end the run
# with "Different tests were collected" (session 27, -n 12 on the H200).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_enable_x64", True)

import jax_flash  # noqa: E402


def pytest_report_header(config):
    return [
        f"jax {jax.__version__}, backend {jax.default_backend()}, devices {jax.devices()}",
        f"jax_flash build: {jax_flash.build_info()}",
    ]


@pytest.fixture
def rng(request):
    """A fresh generator per test, seeded from the test's name (reproducible)."""
    import zlib

    import numpy as np

    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
