"""The decode table of ``python -m jax_flash.benchmark --preset decode`` (issue 22).

Decoding is attention of a few new query tokens over a long cache, bound by
reading the cache, so the table is a latency one: forward time in
microseconds beside the floor, the bytes of K and V read (2*B*S*K*H*itemsize)
at the H200's 4.3 TB/s copy rate, and the ratio to it. Points are (Tq, S):
Tq new tokens per sequence, the newest of S cached ones, causal within the
new tokens (query t at position S - Tq + t sees keys j <= S - Tq + t: the
bottom-right alignment decoding needs). The implementations get it as:

  jax_flash        jax_flash.attention on contiguous [B, S, K, H] keys; Tq = 1 without
                   a mask (every key is visible), Tq > 1 with local_window_size
                   (S, S - Tq): query t sees keys t - S <= j <= t + S - Tq, exactly the
                   bottom-right causal set (attention's is_causal is top-left, and it has
                   no public position offset). Block skipping keeps it a
                   mask-free loop except near the diagonal.
  jax_flash_paged  jax_flash.paged_attention over a pool of --block-size blocks holding
                   the same keys in a shuffled block order, lengths S; one row per block
                   size (default 16, 64 and 256: issue 22's range), a column each.
  cudnn, xla       jax.nn.dot_product_attention(implementation=...): Tq = 1 without a
                   mask; Tq > 1 with a bool [1, 1, Tq, S] mask (jax's is_causal is
                   top-left too, and cuDNN takes no right window).
  fa3              FlashAttention-3's flash_mha, is_causal=Tq > 1 (its causal mask is
                   bottom-right aligned).

Ragged points (--ragged-points TQ:S, Tq = 1): the B sequences' lengths
spread evenly over 1..S (ragged_lengths), a serving batch's mix; the floor
is then the bytes of the keys the lengths cover, and the implementations
take the lengths as jax_flash's and jax.nn.dot_product_attention's
key_value_seq_lengths and paged_attention's own (FA3's flash_mha takes none:
n/a). A time in proportion to the keys read is issue 22's target there.

Timing is the harness's (benchmark._median_seconds: compile, warm up, samples
of back-to-back calls lasting --min-sample-ms, the median of --iters). Every
row also records its largest difference from the jax_flash row of its point
(a check that all of them compute the same attention).
"""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp
import numpy as np

import jax_flash

# (Tq, S), the table.
DECODE_POINTS = ((1, 8192), (1, 32768), (1, 131072), (16, 32768))
DECODE_IMPLEMENTATIONS = ("jax_flash", "jax_flash_paged", "cudnn", "xla")
COPY_BYTES_PER_S = 4.3e12  # the H200's measured copy rate (issue 22)
DECODE_DEFAULTS = {"batch": 8, "heads": 32, "kv_heads": 8, "block_size": [16, 64, 256]}


class Unsupported(Exception):
    """fa3 that does not import: an n/a row."""


def kv_bytes(batch, seqlen, kv_heads, head_dim, dtype, lengths=None) -> int:
    """Bytes of K and V a decode step reads at least: 2 * B * S * K * H * itemsize, with
    B * S the sum of the sequences' lengths where they are given (ragged points)."""
    positions = batch * seqlen if lengths is None else int(np.sum(lengths))
    return 2 * positions * kv_heads * head_dim * jnp.dtype(dtype).itemsize


def floor_us(batch, seqlen, kv_heads, head_dim, dtype, lengths=None) -> float:
    return kv_bytes(batch, seqlen, kv_heads, head_dim, dtype, lengths) / COPY_BYTES_PER_S * 1e6


def ragged_lengths(batch: int, seqlen: int) -> np.ndarray:
    """A ragged batch's lengths: evenly spread over 1..S (the last sequence full)."""
    return np.maximum(1, np.round(np.arange(1, batch + 1) * seqlen / batch)).astype(np.int32)


def point(text: str) -> tuple:
    """TQ:S (e.g. 16:32768) -> (tq, s)."""
    try:
        tq, s = (int(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected TQ:S, e.g. 1:8192; got {text!r}") from None
    if not 1 <= tq <= s:
        raise argparse.ArgumentTypeError(f"TQ:S needs 1 <= TQ <= S; got {text!r}")
    return tq, s


def decode_inputs(batch, tq, seqlen, heads, kv_heads, head_dim, dtype, block_size, seed, ragged=False) -> dict:
    """One point's arrays, made on the device (1 GiB each at S = 131072) and shared by every
    implementation: q, k, v; the same k, v as a shuffled pool with its block tables and lengths
    (all S, or ragged_lengths, which also go to the contiguous calls as "kv_lengths", None when
    not ragged); and the bottom-right causal mask for jax.nn.dot_product_attention (None at Tq = 1)."""
    if ragged and tq != 1:
        raise ValueError(f"ragged points take Tq = 1 (the contiguous calls have no per-sequence "
                         f"bottom-right alignment); got Tq = {tq}")
    order = _block_order(batch, seqlen, block_size, seed)
    arrays = _random_arrays(jax.random.key(seed), jnp.asarray(order), batch, tq, seqlen, heads, kv_heads,
                            head_dim, jnp.dtype(dtype), block_size)
    arrays["block_tables"] = jnp.asarray(order.reshape(batch, -1))
    arrays["lengths"] = jnp.asarray(ragged_lengths(batch, seqlen) if ragged else np.full(batch, seqlen, np.int32))
    arrays["kv_lengths"] = arrays["lengths"] if ragged else None
    arrays["mask"] = None
    if tq > 1:
        arrays["mask"] = jnp.asarray(np.arange(seqlen)[None, :] <= seqlen - tq + np.arange(tq)[:, None])[None, None]
    return arrays


def _block_order(batch, seqlen, block_size, seed) -> np.ndarray:
    """Block i of the contiguous order goes to pool block order[i]: block_tables[b, j] = order[b * S / bs + j]."""
    if seqlen % block_size:
        raise ValueError(f"--block-size {block_size} does not divide S = {seqlen}")
    return np.random.default_rng(seed).permutation(batch * (seqlen // block_size)).astype(np.int32)


def repaged(arrays, block_size, seed) -> dict:
    """`arrays` (decode_inputs') with the pool and block tables rebuilt at another block size:
    the same k and v in a shuffled order of block_size blocks."""
    batch, seqlen = arrays["k"].shape[:2]
    order = _block_order(batch, seqlen, block_size, seed)
    key_cache, value_cache = _pools(arrays["k"], arrays["v"], jnp.asarray(order), block_size)
    return {**arrays, "key_cache": key_cache, "value_cache": value_cache,
            "block_tables": jnp.asarray(order.reshape(batch, -1))}


@functools.partial(jax.jit, static_argnums=3)
def _pools(k, v, order, block_size):
    pool_shape = (order.shape[0], block_size) + k.shape[2:]
    return tuple(jnp.zeros(pool_shape, x.dtype).at[order].set(x.reshape(pool_shape)) for x in (k, v))


@functools.partial(jax.jit, static_argnums=range(2, 10))
def _random_arrays(key, order, batch, tq, seqlen, heads, kv_heads, head_dim, dtype, block_size):
    # One compiled function: made op by op, the arrays cost a compilation each (seconds in the tests).
    q_key, kv_key = jax.random.split(key)
    q = jax.random.normal(q_key, (batch, tq, heads, head_dim), dtype)
    k, v = jax.random.normal(kv_key, (2, batch, seqlen, kv_heads, head_dim), dtype)
    pool_shape = (order.shape[0], block_size, kv_heads, head_dim)
    pool = lambda x: jnp.zeros(pool_shape, dtype).at[order].set(x.reshape(pool_shape))
    return {"q": q, "k": k, "v": v, "key_cache": pool(k), "value_cache": pool(v)}


def decode_fn(impl: str, fa3_import=None, ragged=False):
    """(fn, the names of its arrays in decode_inputs): fn(*arrays) -> [B, Tq, N, H]."""
    if impl == "jax_flash":
        def attn(q, k, v, lengths):
            tq, s = q.shape[1], k.shape[1]
            return jax_flash.attention(q, k, v, local_window_size=(s, s - tq) if tq > 1 else None,
                                       key_value_seq_lengths=lengths)
        return attn, ("q", "k", "v", "kv_lengths")
    if impl == "jax_flash_paged":
        return jax_flash.paged_attention, ("q", "key_cache", "value_cache", "block_tables", "lengths")
    if impl in ("cudnn", "xla"):
        def attn(q, k, v, mask, lengths):
            return jax.nn.dot_product_attention(q, k, v, mask=mask, key_value_seq_lengths=lengths,
                                                implementation=impl)
        return attn, ("q", "k", "v", "mask", "kv_lengths")
    if impl == "fa3":
        fa3, why = fa3_import()
        if fa3 is None:
            raise Unsupported(f"fa3 not importable ({why})")
        if ragged:
            raise Unsupported("fa3: flash_mha takes no per-sequence lengths")
        return (lambda q, k, v: fa3.flash_mha(q, k, v, is_causal=q.shape[1] > 1)), ("q", "k", "v")
    raise ValueError(f"unknown decode implementation {impl!r}")


def run_point(impls, batch, tq, seqlen, heads, kv_heads, head_dim, dtype, block_sizes, iters, min_sample_s,
              seed, median_seconds, fa3_import, ragged=False) -> list:
    """A row per implementation at one (Tq, S) (jax_flash_paged: one per block size in
    `block_sizes`, an int or a sequence), printed as it comes; a failure is that row's error."""
    block_sizes = (block_sizes,) if isinstance(block_sizes, int) else tuple(block_sizes)
    lengths = ragged_lengths(batch, seqlen) if ragged else None
    fields = {"variant": "decode_ragged" if ragged else "decode", "batch": batch, "tq": tq, "seqlen": seqlen,
              "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "dtype": jnp.dtype(dtype).name,
              "floor_us": floor_us(batch, seqlen, kv_heads, head_dim, dtype, lengths)}
    if ragged:
        fields["lengths"] = lengths.tolist()
    arrays = decode_inputs(batch, tq, seqlen, heads, kv_heads, head_dim, dtype, block_sizes[0], seed, ragged)
    runs = [(impl, bs) for impl in impls for bs in (block_sizes if impl == "jax_flash_paged" else (None,))]
    baseline, rows = None, []
    for impl, block_size in runs:
        row = {"impl": impl, **fields}
        if impl == "jax_flash_paged":
            row["block_size"] = block_size
            if block_size != block_sizes[0]:
                arrays = repaged(arrays, block_size, seed)
        try:
            fn, names = decode_fn(impl, fa3_import, ragged)
            fwd, args = jax.jit(fn), tuple(arrays[n] for n in names)
            out = np.asarray(fwd(*args), np.float32)
            seconds = median_seconds(fwd, args, iters, min_sample_s)
            row.update(fwd_us=seconds * 1e6, vs_floor=seconds * 1e6 / fields["floor_us"])
            if impl == "jax_flash":
                baseline = out
            if baseline is not None:
                row["max_diff_vs_jax_flash"] = float(np.max(np.abs(out - baseline)))
        except Unsupported as e:
            row.update(error=str(e), unsupported=True)
        except Exception as e:  # e.g. cudnn on the CPU or at a shape it refuses
            row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
        rows.append(row)
        print(_row_line(row), flush=True)
    return rows


def _row_line(r) -> str:
    name = r["impl"] + (f" (block {r['block_size']})" if "block_size" in r else "")
    if "error" in r:
        return f"{name} Tq={r['tq']} S={_s_label(r)}: {r['error']}"
    diff = f", max diff vs jax_flash {r['max_diff_vs_jax_flash']:.2e}" if "max_diff_vs_jax_flash" in r else ""
    return (f"{name} Tq={r['tq']} S={_s_label(r)}: {r['fwd_us']:.1f} us "
            f"({r['vs_floor']:.2f}x the {r['floor_us']:.1f} us floor){diff}")


DECODE_TABLE_NOTE = (
    "Forward time in microseconds (its ratio to the floor in parentheses); floor: the bytes of K and V\n"
    "read (2*B*S*K*H*itemsize) at 4.3e12 B/s. n/a: not importable; err: failed (results.json says why).\n"
    "S = 1..S (ragged): the sequences' lengths spread over 1..S, the floor over the keys they cover.")


def _s_label(r) -> str:
    return f"1..{r['seqlen']} (ragged)" if r["variant"] == "decode_ragged" else str(r["seqlen"])


def decode_table(rows) -> str:
    """One line per (Tq, S), a column per implementation (the paged one per block size when
    there are several, "jax_flash_paged/16"), then the floor: the issue's table."""
    several = len({r["block_size"] for r in rows if "block_size" in r}) > 1
    column = lambda r: f"{r['impl']}/{r['block_size']}" if several and "block_size" in r else r["impl"]
    impls = list(dict.fromkeys(column(r) for r in rows))
    by_point = {}
    for r in rows:
        by_point.setdefault((r["batch"], r["tq"], _s_label(r), r["heads"], r["kv_heads"], r["head_dim"]), {})[
            column(r)] = r
    lines = ["| B | Tq | S | N | K | H | " + " | ".join(f"{i} us" for i in impls) + " | floor us |",
             "|" + "---|" * (7 + len(impls))]
    for (b, tq, s, n, k, h), here in by_point.items():
        cells = []
        for impl in impls:
            r = here.get(impl)
            if r is None:
                cells.append("-")
            elif "error" in r:
                cells.append("n/a" if r.get("unsupported") else "err")
            else:
                cells.append(f"{r['fwd_us']:.1f} ({r['vs_floor']:.2f}x)")
        floor = next(iter(here.values()))["floor_us"]
        lines.append(f"| {b} | {tq} | {s} | {n} | {k} | {h} | " + " | ".join(cells) + f" | {floor:.1f} |")
    return "\n".join(lines)
