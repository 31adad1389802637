#!/usr/bin/env bash
# One device call: our fused backward beside FlashAttention-2's (PyTorch SDPA's
# flash backend, where the device image has torch) at one shape: each run
# back to back with the card's clock and power sampled
# (scripts/sustained_clocks.py), then one launch of each backward kernel
# under Nsight Compute with the same sections. Cycle counts and instruction
# mixes compare the kernels; the sustained runs say whether clocks differ.
#   PEER_SHAPE=1,16384,16,128 bash scripts/peer_profile.sh
set -uo pipefail
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
shape=${PEER_SHAPE:-1,16384,16,128}
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.is_available())" > "$OUT/peer.txt" 2>&1
python3 -m pip list 2>/dev/null | grep -i -E "^(torch|flash|jax|jaxlib) " >> "$OUT/peer.txt"
export CMAKE_BUILD_PARALLEL_LEVEL=16
start=$(date +%s)
python3 -m pip install --no-build-isolation --no-deps . > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build: $(( $(date +%s) - start )) s" >> "$OUT/peer.txt"
root=$(pwd)
cd /tmp
export XLA_PYTHON_CLIENT_PREALLOCATE=false
probe="$root/scripts/sustained_clocks.py"
impls="jax_flash cudnn"
python3 -c "import torch" 2>/dev/null && impls="jax_flash torch_flash cudnn"
# PEER_FORWARD=1 adds forward-only runs (at PEER_FORWARD_SHAPE, default the same shape).
for causal in ${PEER_CAUSAL:-0 1}; do
  for impl in $impls; do
    python3 "$probe" --impl $impl --shape "$shape" --causal $causal --seconds ${PEER_SECONDS:-6} 2>&1 | tail -1 >> "$OUT/peer.txt"
    [ -n "${PEER_FORWARD:-}" ] && python3 "$probe" --impl $impl --shape "${PEER_FORWARD_SHAPE:-$shape}" --causal $causal \
      --forward-only --seconds ${PEER_SECONDS:-6} 2>&1 | tail -1 >> "$OUT/peer.txt"
  done
done
sections="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
  --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section ComputeWorkloadAnalysis \
  --section InstructionStats --section SchedulerStats --print-details all"
profile() {  # name kernel-regex impl
  timeout 200 ncu --clock-control none --kernel-name regex:"$2" --launch-count 1 $sections \
    python3 "$probe" --impl "$3" --shape "$shape" --causal ${PEER_NCU_CAUSAL:-0} --seconds 0 > "$OUT/ncu_$1.txt" 2>&1
}
profile ours DkvKernel jax_flash
python3 -c "import torch" 2>/dev/null && profile fa2 flash_bwd_dq_dk_dv torch_flash
keys="Duration|Elapsed Cycles|SM Frequency|Registers Per|Shared Memory Config|Dynamic Shared|Static Shared|Block Size|Grid Size|Issue Slots Busy|Executed Ipc Active|Warp Cycles Per Issued|Stall|Compute \(SM\)|Memory Throughput|L1/TEX Hit|L2 Hit|Shared|Bank|Executed Instructions  |Achieved Occupancy|Tensor|pipe"
for f in "$OUT"/ncu_*.txt; do echo "== $f"; grep -E "$keys" "$f" | head -60; done >> "$OUT/peer.txt"
cat "$OUT/peer.txt"
