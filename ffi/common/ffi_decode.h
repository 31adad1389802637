// Turns the FFI buffers of a call into AttentionParams, checking what Python
// already validated (a handler must never trust its caller blindly: a bad
// shape here becomes an ffi::Error, not an out-of-bounds read).
#pragma once

#include <string>

#include "common/params.h"
#include "xla/ffi/api/ffi.h"

namespace jax_flash {

namespace ffi = xla::ffi;

inline std::string DimsToString(ffi::AnyBuffer::Dimensions dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(dims[i]);
  }
  return s + "]";
}

// " (B=.., Tq=.., Tk=.., N=.., K=.., H=..)": the shape a handler's error
// message names (the launchers' own messages name their kernel).
inline std::string ShapeSuffix(const AttentionShape& s) {
  return " (B=" + std::to_string(s.batch) + ", Tq=" + std::to_string(s.seqlen_q) + ", Tk=" +
         std::to_string(s.seqlen_k) + ", N=" + std::to_string(s.num_heads) + ", K=" +
         std::to_string(s.num_heads_k) + ", H=" + std::to_string(s.head_dim) + ")";
}

// An internal error whose message names the call's shape (unless the
// launcher's message already did: the sm90 and decode launchers do).
inline ffi::Error InternalWithShape(const std::string& message, const AttentionShape& s) {
  const bool named = message.find("Tq=") != std::string::npos || message.find("seqlen_q") != std::string::npos;
  return ffi::Error::Internal(named ? message : message + ShapeSuffix(s));
}

// q: [..., Tq, N, H]; k, v: [..., Tk, K, H] with equal leading dims.
inline ffi::Error DecodeShape(const ffi::AnyBuffer& q, const ffi::AnyBuffer& k,
                              const ffi::AnyBuffer& v, AttentionShape* shape) {
  auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions();
  if (qd.size() < 4 || kd.size() != qd.size() || vd.size() != qd.size()) {
    return ffi::Error::InvalidArgument(
        "jax_flash: query, key and value must have the same rank >= 4, got " +
        DimsToString(qd) + ", " + DimsToString(kd) + ", " + DimsToString(vd));
  }
  if (q.element_type() != k.element_type() ||
      q.element_type() != v.element_type()) {
    return ffi::Error::InvalidArgument(
        "jax_flash: query, key and value must have one dtype");
  }
  const size_t r = qd.size();
  int64_t batch = 1;
  for (size_t i = 0; i + 3 < r; ++i) {
    if (kd[i] != qd[i] || vd[i] != qd[i]) {
      return ffi::Error::InvalidArgument(
          "jax_flash: batch dims differ: query " + DimsToString(qd) +
          ", key " + DimsToString(kd) + ", value " + DimsToString(vd));
    }
    batch *= qd[i];
  }
  for (size_t i = r - 3; i < r; ++i) {
    if (vd[i] != kd[i]) {
      return ffi::Error::InvalidArgument("jax_flash: value " +
                                         DimsToString(vd) + " != key " +
                                         DimsToString(kd));
    }
  }
  shape->batch = batch;
  shape->seqlen_q = qd[r - 3];
  shape->num_heads = qd[r - 2];
  shape->head_dim = qd[r - 1];
  shape->seqlen_k = kd[r - 3];
  shape->num_heads_k = kd[r - 2];
  if (kd[r - 1] != shape->head_dim) {
    return ffi::Error::InvalidArgument("jax_flash: key head dim " +
                                       std::to_string(kd[r - 1]) +
                                       " != query head dim " +
                                       std::to_string(shape->head_dim));
  }
  if (shape->num_heads_k <= 0 || shape->num_heads % shape->num_heads_k != 0) {
    return ffi::Error::InvalidArgument(
        "jax_flash: key heads must divide query heads");
  }
  if (shape->seqlen_q <= 0 || shape->seqlen_k <= 0 || shape->head_dim <= 0) {
    return ffi::Error::InvalidArgument("jax_flash: empty sequence or head dim");
  }
  return ffi::Error::Success();
}

// Expects `buf` to have exactly the dims of `like` (and dtype when asked).
inline ffi::Error ExpectSameShape(const char* name, const ffi::AnyBuffer& buf,
                                  ffi::AnyBuffer::Dimensions like) {
  auto d = buf.dimensions();
  bool same = d.size() == like.size();
  for (size_t i = 0; same && i < d.size(); ++i) same = d[i] == like[i];
  if (!same) {
    return ffi::Error::InvalidArgument(std::string("jax_flash: ") + name +
                                       " has shape " + DimsToString(d) +
                                       ", expected " + DimsToString(like));
  }
  return ffi::Error::Success();
}

// lse/delta: [..., N, Tq], float32 (float64 for float64 inputs), leading
// dims as the query's.
inline ffi::Error ExpectRowStats(const char* name, const ffi::AnyBuffer& buf,
                                 ffi::DataType input_dtype,
                                 const AttentionShape& s) {
  const ffi::DataType want =
      input_dtype == ffi::DataType::F64 ? ffi::DataType::F64 : ffi::DataType::F32;
  if (buf.element_type() != want) {
    return ffi::Error::InvalidArgument(std::string("jax_flash: ") + name +
                                       " must be float32 (float64 for float64 inputs)");
  }
  auto d = buf.dimensions();
  int64_t count = 1;
  for (auto x : d) count *= x;
  if (d.size() < 2 || d[d.size() - 1] != s.seqlen_q ||
      d[d.size() - 2] != s.num_heads ||
      count != s.batch * s.num_heads * s.seqlen_q) {
    return ffi::Error::InvalidArgument(std::string("jax_flash: ") + name +
                                       " has shape " + DimsToString(d) +
                                       ", expected [..., heads, seqlen_q]");
  }
  return ffi::Error::Success();
}

inline void FillStrides(AttentionParams* p) {
  const auto& s = p->shape;
  p->q_stride = ContiguousBtnh(s.seqlen_q, s.num_heads, s.head_dim);
  p->k_stride = ContiguousBtnh(s.seqlen_k, s.num_heads_k, s.head_dim);
}

}  // namespace jax_flash

namespace jax_flash {

// The forward's buffers: q, k, v -> out (like q), lse [..., N, Tq] float32.
inline ffi::Error BuildForwardParams(const ffi::AnyBuffer& q,
                                     const ffi::AnyBuffer& k,
                                     const ffi::AnyBuffer& v,
                                     const ffi::AnyBuffer& out,
                                     const ffi::AnyBuffer& lse, double scale,
                                     int32_t is_causal, AttentionParams* p) {
  if (auto e = DecodeShape(q, k, v, &p->shape); e.failure()) return e;
  if (auto e = ExpectSameShape("out", out, q.dimensions()); e.failure())
    return e;
  if (out.element_type() != q.element_type())
    return ffi::Error::InvalidArgument("jax_flash: out dtype != query dtype");
  if (auto e = ExpectRowStats("lse", lse, q.element_type(), p->shape); e.failure())
    return e;
  FillStrides(p);
  p->q = q.untyped_data();
  p->k = k.untyped_data();
  p->v = v.untyped_data();
  p->out = out.untyped_data();
  p->lse = lse.untyped_data();
  p->scale = scale;
  p->is_causal = is_causal != 0;
  return ffi::Error::Success();
}

// The backward's buffers: q, k, v, out, lse, dout -> dq, dk, dv, delta.
inline ffi::Error BuildBackwardParams(
    const ffi::AnyBuffer& q, const ffi::AnyBuffer& k, const ffi::AnyBuffer& v,
    const ffi::AnyBuffer& out, const ffi::AnyBuffer& lse,
    const ffi::AnyBuffer& dout, const ffi::AnyBuffer& dq,
    const ffi::AnyBuffer& dk, const ffi::AnyBuffer& dv,
    const ffi::AnyBuffer& delta, double scale, int32_t is_causal,
    AttentionParams* p) {
  if (auto e = BuildForwardParams(q, k, v, out, lse, scale, is_causal, p);
      e.failure())
    return e;
  if (auto e = ExpectSameShape("dout", dout, q.dimensions()); e.failure())
    return e;
  if (auto e = ExpectSameShape("dq", dq, q.dimensions()); e.failure())
    return e;
  if (auto e = ExpectSameShape("dk", dk, k.dimensions()); e.failure())
    return e;
  if (auto e = ExpectSameShape("dv", dv, k.dimensions()); e.failure())
    return e;
  if (auto e = ExpectRowStats("delta", delta, q.element_type(), p->shape); e.failure())
    return e;
  for (const ffi::AnyBuffer* b : {&dout, &dq, &dk, &dv}) {
    if (b->element_type() != q.element_type())
      return ffi::Error::InvalidArgument(
          "jax_flash: gradient dtypes must match the query dtype");
  }
  p->dout = dout.untyped_data();
  p->dq = dq.untyped_data();
  p->dk = dk.untyped_data();
  p->dv = dv.untyped_data();
  p->delta = delta.untyped_data();
  return ffi::Error::Success();
}

// JAX_FLASH_POISON_OUTPUTS=1 makes handlers fill their outputs with NaN before
// the kernels run, so a test catches any element a kernel forgot to write.
bool PoisonOutputsRequested();

}  // namespace jax_flash
