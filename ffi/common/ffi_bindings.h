// The operand and attribute lists of the FFI targets, shared by the CPU
// and CUDA registrations so the two platforms cannot drift apart.
// (registered as jax_flash_{fwd,bwd,dbias,paged_fwd}_v<ABI>, module.cc: the
// suffix changes with these lists; paged_fwd is CPU-only so far)
//   jax_flash_fwd:   q, k, v, <features>                   -> out, lse, decode_scratch
//   jax_flash_bwd:   q, k, v, out, lse, dout, <features>   -> dq, dk, dv, delta, dq_accum
//   jax_flash_dbias: q, k, v, out, lse, dout, <features>   -> dbias, delta, dbias_accum
// <features>: bias, mask, q_seqlens, kv_seqlens, q_segment_ids,
// kv_segment_ids, q_segment_ranges, kv_segment_ranges, dropout_seed,
// position_offsets, mask_blocks, sinks operands (placeholders when unused;
// sinks are read by the forward only) and the attributes below.
#pragma once

#include "xla/ffi/api/ffi.h"

#define JAX_FLASH_FEATURE_ARGS(binding)          \
  binding.Arg<xla::ffi::AnyBuffer>()   /* bias */ \
      .Arg<xla::ffi::AnyBuffer>()      /* mask */ \
      .Arg<xla::ffi::AnyBuffer>()      /* q_seqlens */ \
      .Arg<xla::ffi::AnyBuffer>()      /* kv_seqlens */ \
      .Arg<xla::ffi::AnyBuffer>()      /* q_segment_ids */ \
      .Arg<xla::ffi::AnyBuffer>()      /* kv_segment_ids */ \
      .Arg<xla::ffi::AnyBuffer>()      /* q_segment_ranges */ \
      .Arg<xla::ffi::AnyBuffer>()      /* kv_segment_ranges */ \
      .Arg<xla::ffi::AnyBuffer>()      /* dropout_seed */ \
      .Arg<xla::ffi::AnyBuffer>()      /* position_offsets */ \
      .Arg<xla::ffi::AnyBuffer>()      /* mask_blocks */ \
      .Arg<xla::ffi::AnyBuffer>()      /* sinks */ \
      .Attr<double>("scale")                      \
      .Attr<int32_t>("is_causal")                 \
      .Attr<int32_t>("implementation")            \
      .Attr<int32_t>("features")                  \
      .Attr<int64_t>("window_left")               \
      .Attr<int64_t>("window_right")              \
      .Attr<double>("softcap")                    \
      .Attr<double>("dropout_rate")               \
      .Attr<int32_t>("deterministic")

// Parameter list matching JAX_FLASH_FEATURE_ARGS, for handler signatures.
#define JAX_FLASH_FEATURE_PARAMS                                                        \
  xla::ffi::AnyBuffer bias, xla::ffi::AnyBuffer mask, xla::ffi::AnyBuffer q_seqlens,    \
      xla::ffi::AnyBuffer kv_seqlens, xla::ffi::AnyBuffer q_segment_ids,               \
      xla::ffi::AnyBuffer kv_segment_ids, xla::ffi::AnyBuffer q_segment_ranges,         \
      xla::ffi::AnyBuffer kv_segment_ranges, xla::ffi::AnyBuffer dropout_seed,            \
      xla::ffi::AnyBuffer position_offsets, xla::ffi::AnyBuffer mask_blocks, xla::ffi::AnyBuffer sinks, double scale, \
      int32_t is_causal, int32_t implementation, int32_t features, int64_t window_left,  \
      int64_t window_right, double softcap, double dropout_rate, int32_t deterministic

// Builds the FeatureOperands view inside a handler with those parameters.
#define JAX_FLASH_FEATURE_OPERANDS                                                      \
  ::jax_flash::FeatureOperands {                                                        \
    bias, mask, q_seqlens, kv_seqlens, q_segment_ids, kv_segment_ids, q_segment_ranges, \
        kv_segment_ranges, dropout_seed, position_offsets, mask_blocks, sinks,          \
        features, window_left, window_right, softcap, dropout_rate                      \
  }

// decode_scratch: float32 partials of the CUDA split-KV decode path
// (cuda/decode/launch.h: DecodeScratchFloats), one element where Python
// foresees no use for it; the CPU ignores it.
#define JAX_FLASH_FWD_BINDING(ctx) \
  JAX_FLASH_FEATURE_ARGS(ctx.Arg<xla::ffi::AnyBuffer>().Arg<xla::ffi::AnyBuffer>().Arg<xla::ffi::AnyBuffer>()) \
      .Ret<xla::ffi::AnyBuffer>()  /* out */ \
      .Ret<xla::ffi::AnyBuffer>()  /* lse */ \
      .Ret<xla::ffi::AnyBuffer>()  /* decode_scratch */

#define JAX_FLASH_BWD_ARGS(ctx)                                                            \
  JAX_FLASH_FEATURE_ARGS(ctx.Arg<xla::ffi::AnyBuffer>() /* q */                            \
                             .Arg<xla::ffi::AnyBuffer>() /* k */                           \
                             .Arg<xla::ffi::AnyBuffer>() /* v */                           \
                             .Arg<xla::ffi::AnyBuffer>() /* out */                         \
                             .Arg<xla::ffi::AnyBuffer>() /* lse */                         \
                             .Arg<xla::ffi::AnyBuffer>() /* dout */)

#define JAX_FLASH_BWD_BINDING(ctx)                                 \
  JAX_FLASH_BWD_ARGS(ctx)                                          \
      .Ret<xla::ffi::AnyBuffer>()  /* dq */                        \
      .Ret<xla::ffi::AnyBuffer>()  /* dk */                        \
      .Ret<xla::ffi::AnyBuffer>()  /* dv */                        \
      .Ret<xla::ffi::AnyBuffer>()  /* delta (scratch) */               \
      .Ret<xla::ffi::AnyBuffer>()  /* dq_accum (float32 scratch or empty) */

// dbias: the bias's shape and dtype. dbias_accum: float32 scratch in the
// bias's shape where the CUDA kernels sum a broadcast 16-bit bias's gradient
// by atomics (jax_flash/_kernel_call.py dbias_accumulator_shape), else one
// element; the CPU ignores it.
#define JAX_FLASH_DBIAS_BINDING(ctx)                       \
  JAX_FLASH_BWD_ARGS(ctx)                                  \
      .Ret<xla::ffi::AnyBuffer>()  /* dbias */             \
      .Ret<xla::ffi::AnyBuffer>()  /* delta (scratch) */   \
      .Ret<xla::ffi::AnyBuffer>()  /* dbias_accum (float32 scratch) */

// jax_flash_paged_fwd: q, k_cache, v_cache, block_tables, seq_lengths -> out, lse, decode_scratch
// (forward only; ffi/common/paged_params.h has the shapes).
#define JAX_FLASH_PAGED_FWD_BINDING(ctx)                          \
  ctx.Arg<xla::ffi::AnyBuffer>()      /* q */                     \
      .Arg<xla::ffi::AnyBuffer>()     /* k_cache */               \
      .Arg<xla::ffi::AnyBuffer>()     /* v_cache */               \
      .Arg<xla::ffi::AnyBuffer>()     /* block_tables */          \
      .Arg<xla::ffi::AnyBuffer>()     /* seq_lengths */           \
      .Attr<double>("scale")                                      \
      .Attr<double>("softcap")                                    \
      .Attr<int64_t>("window_left")                               \
      .Ret<xla::ffi::AnyBuffer>()     /* out */                   \
      .Ret<xla::ffi::AnyBuffer>()     /* lse */                   \
      .Ret<xla::ffi::AnyBuffer>()     /* decode_scratch */
