// The end of a forward softmax row, shared by every family's epilogue: the
// factor that turns the row's accumulated P V into its output, and its
// natural-log logsumexp, with an attention sink (gpt-oss: one logit per
// query head in the denominator, with no value) when the call has one.
#pragma once

#include <cmath>

#include "common/params.h"

namespace jax_flash {

template <typename Acc>
struct RowEnd {
  Acc scale;  // output row = accumulated P V * scale
  Acc lse;    // natural log; -inf for a row that saw nothing (and no sink)
};

namespace row_end_detail {
JAX_FLASH_HOST_DEVICE inline float Exp2(float x) { return exp2f(x); }
JAX_FLASH_HOST_DEVICE inline double Exp2(double x) { return exp2(x); }
JAX_FLASH_HOST_DEVICE inline float Log2(float x) { return log2f(x); }
JAX_FLASH_HOST_DEVICE inline double Log2(double x) { return log2(x); }
}  // namespace row_end_detail

// The sink of flat batch entry b's query head h in log2 units (the kernels'
// row maxima are log2 units of the final logits), or -inf where the call has
// none (AttentionFeatures::sinks).
template <typename Acc>
JAX_FLASH_HOST_DEVICE inline Acc SinkLog2(const AttentionFeatures& f, int64_t b, int64_t h, int64_t num_heads) {
  if (!f.sinks) return Acc(-INFINITY);
  return static_cast<const Acc*>(f.sinks)[(b / f.sinks_group) * num_heads + h] *
         Acc(1.4426950408889634073599246810019);
}

// m2: the row's running maximum and l its sum of 2^(x - m2) over the visible
// keys (x in log2 units), as each family's online softmax leaves them; sink2
// the row's SinkLog2. Without a sink exactly the former epilogues' formulas
// (1 / l and (m2 + log2 l) ln 2; a row that saw nothing: zeros and -inf).
// With one, the denominator gains 2^(sink2 - m2), taken against max(m2,
// sink2) so that a sink far above the logits neither overflows nor loses
// the keys' share: a row that saw nothing gets zeros and the sink as its
// logsumexp, as with_sinks (jax_flash/_kernel_call.py) and the reference.
template <typename Acc>
JAX_FLASH_HOST_DEVICE inline RowEnd<Acc> EndRow(Acc m2, Acc l, Acc sink2) {
  using row_end_detail::Exp2;
  using row_end_detail::Log2;
  const Acc ln2 = Acc(0.69314718055994530941723212145818);
  if (!(sink2 > -INFINITY)) return {l > Acc(0) ? Acc(1) / l : Acc(0), l > Acc(0) ? (m2 + Log2(l)) * ln2 : Acc(-INFINITY)};
  const Acc m = l > Acc(0) && m2 > sink2 ? m2 : sink2;
  const Acc keys = l > Acc(0) ? Exp2(m2 - m) : Acc(0);  // the keys' terms rescaled to m (none: 0)
  const Acc denominator = l * keys + Exp2(sink2 - m);
  return {keys / denominator, (m + Log2(denominator)) * ln2};
}

}  // namespace jax_flash
