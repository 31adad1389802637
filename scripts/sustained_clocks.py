"""Forward (+ backward) of one attention implementation, back to back for a few
seconds, with the GPU's clock, power and throttle reasons sampled beside it.

The harness times short bursts; Nsight Compute times single launches at
whatever clock the idle card boosts to. This says what a kernel sustains, and
whether the card is power-capped while it runs (a kernel that moves more bytes
per FLOP pays for them in clock). Calls are enqueued in bursts of >= 20 ms and
waited for once per burst, so the host's dispatch latency stays hidden even
for sub-millisecond calls. `--seconds 0` runs one call after the warm-up: a
target for `ncu --launch-count 1`.

    python3 scripts/sustained_clocks.py --impl jax_flash --shape 1,16384,16,128
    python3 scripts/sustained_clocks.py --impl torch_flash --shape 1,16384,16,128  # FlashAttention-2 via SDPA
    python3 scripts/sustained_clocks.py --impl jax_flash --shape 16,1024,16,128 --forward-only

FLOPs as the harness counts them: forward 4*B*N*T*T*H (halved when causal),
forward + backward 3.5x that. Shapes are B,T,N,H; inputs are bf16.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time

IMPLS = ("jax_flash", "cudnn", "torch_flash")


def jax_step(impl: str, b: int, t: int, n: int, h: int, causal: bool, dtype: str = "bfloat16",
             forward_only: bool = False):
    """A function enqueuing one fwd+bwd (the VJP of a given random dO), returning
    (out, (dq, dk, dv)) without waiting; or the forward alone, returning out.
    Inputs: q, k, v, dO drawn in that order from numpy's default_rng(0)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(0)
    q, k, v, dout = (jnp.asarray(rng.standard_normal((b, t, n, h)), dtype) for _ in range(4))
    if impl == "jax_flash":
        import jax_flash

        def attn(q, k, v):
            return jax_flash.attention(q, k, v, is_causal=causal)
    else:
        def attn(q, k, v):
            return jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="cudnn")

    def fwd_bwd(q, k, v, dout):
        out, vjp = jax.vjp(attn, q, k, v)
        return out, vjp(dout)

    if forward_only:
        fn = jax.jit(attn)
        return lambda: fn(q, k, v)
    fn = jax.jit(fwd_bwd)
    return lambda: fn(q, k, v, dout)


def jax_wait(result):
    import jax

    return jax.block_until_ready(result)


def torch_step(b: int, t: int, n: int, h: int, causal: bool, forward_only: bool = False):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    gen = torch.Generator(device="cuda").manual_seed(0)
    shape = (b, n, t, h)  # SDPA's layout
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
               for _ in range(3))
    dout = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)

    def step():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            if forward_only:
                with torch.no_grad():
                    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        for x in (q, k, v):
            x.grad = None  # else every backward also adds into the previous gradients
        out.backward(dout)
        return out

    return step


def torch_wait(result):
    import torch

    torch.cuda.synchronize()
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--impl", choices=IMPLS, default="jax_flash")
    parser.add_argument("--shape", default="1,16384,16,128", help="B,T,N,H")
    parser.add_argument("--causal", type=int, default=0)
    parser.add_argument("--forward-only", action="store_true")
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args(argv)
    b, t, n, h = map(int, args.shape.split(","))
    causal = bool(args.causal)
    if args.impl == "torch_flash":
        step, wait = torch_step(b, t, n, h, causal, args.forward_only), torch_wait
    else:
        step, wait = jax_step(args.impl, b, t, n, h, causal, forward_only=args.forward_only), jax_wait
    wait(step())  # compile / warm up
    start = time.perf_counter()
    wait(step())
    if args.seconds <= 0:
        return
    burst = max(1, int(0.02 / (time.perf_counter() - start)))  # calls per >= 20 ms
    smi = subprocess.Popen(
        ["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active",
         "--format=csv,noheader,nounits", "-lms", "200"], stdout=subprocess.PIPE, text=True)
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < args.seconds:
        for _ in range(burst):
            result = step()
        wait(result)
        calls += burst
    elapsed = time.perf_counter() - start
    smi.terminate()
    samples = [line.split(", ") for line in smi.communicate()[0].splitlines() if line.count(",") == 3]
    # The first samples may predate the loop's load; keep the second half.
    samples = samples[len(samples) // 2:]
    flops = (1 if args.forward_only else 3.5) * 4 * b * n * t * t * h / (2 if causal else 1)
    clock = statistics.median(float(s[0]) for s in samples) if samples else float("nan")
    power = statistics.median(float(s[1]) for s in samples) if samples else float("nan")
    reasons = sorted({s[3] for s in samples})
    what = "fwd" if args.forward_only else "fwd+bwd"
    print(f"{args.impl} {args.shape} causal={int(causal)}: {calls} calls in {elapsed:.1f} s, "
          f"{flops * calls / elapsed / 1e12:.1f} TFLOP/s {what}, sm clock {clock:.0f} MHz, "
          f"power {power:.0f} W, throttle reasons {reasons}")


if __name__ == "__main__":
    main()
