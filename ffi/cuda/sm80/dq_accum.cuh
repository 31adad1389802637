// Layout of the fused backward's float32 dQ accumulator (p.dq_accum): per
// (batch, head) the same seqlen_q x d floats, at the same place, as a
// row-major dQ would take, but each full group of 8 rows (rows 8j .. 8j + 7
// of the head) holds its 8 x d floats as d / 8 blocks of 8 x 8, block by
// block, each block row-major. A last, partial group (seqlen_q % 8 rows)
// stays row-major.
//
// Why: a warp's MMA accumulator tile of 8 rows x 8 columns (lane: row
// lane / 4, columns 2 (lane % 4) and + 1) is then one 256-byte run, so the
// warp's float-pair atomic covers two whole 128-byte lines: two L2 requests
// of four sectors each. Row-major rows made it eight one-sector requests:
// the 256 backward sent the L2 1.07G red requests at T=16384, where
// FlashAttention-2, whose reds each cover one whole line, sent 268M; the
// blocks made the backward 7-17% faster (docs/perf_history.md, v15).
#pragma once

#include <cstdint>

namespace jax_flash::cuda::sm80 {

struct DqAccumLayout {
  static constexpr int kGroupRows = 8;
  static constexpr int kBlockCols = 8;

  // Whether the group starting at row `group_row` (a multiple of 8) is full.
  __device__ __forceinline__ static bool FullGroup(int64_t group_row, int64_t seqlen_q) {
    return group_row + kGroupRows <= seqlen_q;
  }
  // Offset of (row r of the group, column c) from the group's first float
  // (row_stat_index(b, h, group_row) * d). Columns c .. c + 7 of a row, c a
  // multiple of 8, are contiguous in both layouts.
  __device__ __forceinline__ static int InGroup(bool full, int r, int c, int d) {
    return full ? (c / kBlockCols) * (kGroupRows * kBlockCols) + r * kBlockCols + c % kBlockCols
                : r * d + c;
  }
  // Distance between a row's consecutive 8-column tiles.
  __device__ __forceinline__ static int TileStride(bool full) {
    return full ? kGroupRows * kBlockCols : kBlockCols;
  }
};

}  // namespace jax_flash::cuda::sm80
