"""Loads the compiled extension once and registers its XLA FFI targets.

The same target names are registered for the "cpu" platform and, when the
CUDA kernels were built, for "CUDA"; XLA picks the handler of the backend a
computation runs on.

The names carry the version of the calls' operand and attribute layout
(``jax_flash_fwd_v4``): a computation serialized with ``jax.export`` against
another layout then fails to compile, naming the missing target, instead of
running with misread operands. Bump ABI_VERSION here and JAX_FLASH_ABI in
ffi/module.cc together whenever the layout changes.
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

ABI_VERSION = 7  # v1: the unversioned names ("jax_flash_fwd", ...) of earlier releases; v3: position offsets; v4: the decode scratch result; v5: dbias's float32 accumulator result (and 16-bit biases); v6: the mask_blocks operand; v7: the sinks operand
FWD_TARGET = f"jax_flash_fwd_v{ABI_VERSION}"
BWD_TARGET = f"jax_flash_bwd_v{ABI_VERSION}"
DBIAS_TARGET = f"jax_flash_dbias_v{ABI_VERSION}"
PAGED_FWD_TARGET = f"jax_flash_paged_fwd_v{ABI_VERSION}"
ATTENTION_TARGETS = (FWD_TARGET, BWD_TARGET, DBIAS_TARGET)
TARGETS = ATTENTION_TARGETS + (PAGED_FWD_TARGET,)
# Both platforms have every target (on CUDA the paged forward runs the split-KV
# decode kernels for 16-bit inputs; float32 takes jax_flash/paged.py's gather).
CUDA_TARGETS = TARGETS


def _register() -> None:
    built = sorted(_ext.cpu_targets())
    if built != sorted(TARGETS):
        # A stale extension (built from other sources than this Python code).
        raise ImportError(
            f"jax_flash's compiled extension registers {built}, but this Python package calls "
            f"{sorted(TARGETS)}: rebuild it (`pip install --no-build-isolation .`)"
        )
    cuda_built = sorted(_ext.cuda_targets())
    if cuda_built and cuda_built != sorted(CUDA_TARGETS):
        raise ImportError(
            f"jax_flash's compiled extension registers CUDA targets {cuda_built}, but this Python "
            f"package expects {sorted(CUDA_TARGETS)}: rebuild it (`pip install --no-build-isolation .`)"
        )
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


def export_safety_checks() -> list:
    """The ``jax.export`` safety checks to disable for jax_flash's custom calls.

    ``jax.export`` refuses custom calls that are not on its list of stable
    targets; pass this as ``disabled_checks``::

        exp = jax.export.export(jax.jit(f), disabled_checks=jax_flash.export_safety_checks())(*args)

    Import jax_flash in the process that deserializes and runs the module (it
    registers the targets). The names carry jax_flash's operand layout version,
    so a module exported by a jax_flash with another layout fails to compile
    ("no registered implementation ... jax_flash_fwd_v<N>") rather than
    computing wrong numbers.
    """
    import jax.export  # a submodule that older jax does not import with jax

    return [jax.export.DisabledSafetyCheck.custom_call(name) for name in TARGETS]
