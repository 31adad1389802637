"""Loads the compiled extension once and registers its XLA FFI targets.

The same target names are registered for the "cpu" platform and, when the
CUDA kernels were built, for "CUDA"; XLA picks the handler of the backend a
computation runs on.
"""

from __future__ import annotations

import jax

try:
    from jax_flash import _ffi as _ext  # the compiled nanobind module (ffi/module.cc)
except ImportError as e:  # pragma: no cover - depends on how Python was started
    import os

    raise ImportError(
        f"jax_flash's compiled extension (_ffi) is not in {os.path.dirname(__file__)}. "
        "This is usually the source tree shadowing the installed package: run from another "
        "directory (or with `pytest tests`, whose conftest handles it) after "
        "`pip install --no-build-isolation .`"
    ) from e

FWD_TARGET = "jax_flash_fwd"
BWD_TARGET = "jax_flash_bwd"
DBIAS_TARGET = "jax_flash_dbias"


def _register() -> None:
    for name, capsule in _ext.cpu_targets().items():
        jax.ffi.register_ffi_target(name, capsule, platform="cpu")
    # "CUDA" is case-sensitive: a lowercase platform name is silently unused.
    for name, capsule in _ext.cuda_targets().items():
        jax.ffi.register_ffi_target(name, capsule, platform="CUDA")


_register()


def build_info() -> dict:
    """What this installation was built with.

    Returns:
      A dict with ``platforms`` (``["cpu"]`` or ``["cpu", "cuda"]``),
      ``cuda_archs`` (CMake architectures, e.g. ``"80-real,90a-real"``),
      ``cuda_version``, ``jax_headers_version`` (the jax whose XLA FFI headers
      were compiled in) and ``cpu_native`` (CPU kernels built for this machine).
    """
    info = dict(_ext.build_info())
    info["platforms"] = ["cpu", "cuda"] if info.pop("cuda") else ["cpu"]
    return info
