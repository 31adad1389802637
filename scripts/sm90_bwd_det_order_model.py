"""A model of the waits of the sm90 deterministic backward's dQ order (DqOrder), per tile order.

    python scripts/sm90_bwd_det_order_model.py

No GPU: a discrete-event model behind LaunchBackwardDeterministic's choice
of tile order (bwd_launch.cuh, kDeterministicSection). Tiles (key block n of
a (batch, key head) pair) are dispatched in BwdTile's index order onto 132
SMs, each as soon as one is free; a tile runs its steps (query blocks,
causal from m_first = n * kBlockN / kBlockM) one per time unit, the dQ send
at each step's end. Deterministic: key block n's send into query block m
waits until key block n - 1's counter for m is visible, which it raises in
the S^T window of the step after the next send (DqOrder; ~0.3 of a step
after that send, plus `fence` for the release and `poll` for the acquire
to see it), the last step's `complete` after its send. The unordered kernel
waits on nothing. Prints, per shape, unordered time / deterministic time
for the orders BwdTile offers: section 0 (non-causal: a head's key blocks
side by side; causal: key blocks outermost over every pair) and the
L2-sized sections (BackwardCausalSection's G pairs), causal also with the
query blocks visited in descending order (not implemented in the kernel).

Not modelled: the deterministic kernel's own per-step cost (its extra
instructions, the release's fence, the acquire's L2 round trip under dK),
L2 hit rates of the orders, unequal step times. Its numbers are the waits
alone; the check program (sm90_bwd_compare_check.sh deterministic) times the real
thing.
"""

from __future__ import annotations

import heapq

SMS = 132


def tile_order(pairs: int, key_blocks: int, causal: bool, section: int) -> list[tuple[int, int]]:
    """BwdTile's (pair, key block) per tile index (kSectionsAlways: sections for non-causal too)."""
    if 0 < section < pairs:
        order = []
        for first in range(0, pairs, section):
            count = min(section, pairs - first)
            order += [(first + p, n) for n in range(key_blocks) for p in range(count)]
        return order
    if causal:
        return [(p, n) for n in range(key_blocks) for p in range(pairs)]
    return [(p, n) for p in range(pairs) for n in range(key_blocks)]


def makespan(pairs, key_blocks, m_blocks, ratio, causal, section, ordered, descending=False,
             poll=0.25, fence=0.1, complete=0.35) -> float:
    """Time to finish every tile, in steps; `ratio` = kBlockN / kBlockM."""
    signal: dict[tuple[int, int, int], float] = {}
    free = [0.0] * SMS
    last = 0.0
    for p, n in tile_order(pairs, key_blocks, causal, section):
        t = heapq.heappop(free)
        first = min(n * ratio, m_blocks) if causal else 0
        blocks = list(range(first, m_blocks))
        if descending:
            blocks.reverse()
        sends = []
        for m in blocks:
            t += 1.0
            if ordered and n > 0:
                t = max(t, signal[(p, n - 1, m)] + poll)
            sends.append(t)
        if ordered:
            for j, m in enumerate(blocks):
                raised = sends[j + 1] + 0.3 if j + 1 < len(blocks) else sends[j] + complete
                signal[(p, n, m)] = raised + fence
        t += 0.2
        last = max(last, t)
        heapq.heappush(free, t)
    return last


def main() -> None:
    # (name, pairs, key blocks, query blocks, kBlockN / kBlockM, sized section): bf16, T = S.
    shapes = [
        ("H=128 B=4 T=4096 N=16", 64, 32, 64, 2, 8),
        ("H=64  B=4 T=4096 N=32", 128, 32, 32, 1, 16),
        ("H=128 B=1 T=16384 N=16", 16, 128, 256, 2, 2),
        ("H=64  B=1 T=16384 N=32", 32, 128, 128, 1, 4),
    ]
    print("unordered time / deterministic time (waits only)")
    for causal in (False, True):
        for name, pairs, kb, mb, ratio, sized in shapes:
            base = makespan(pairs, kb, mb, ratio, causal, 0, False)
            cells = []
            for section in (0, sized):
                for descending in (False, True) if causal else (False,):
                    det = makespan(pairs, kb, mb, ratio, causal, section, True, descending)
                    cells.append(f"sections {section}{' descending' if descending else ''}: {base / det:.3f}")
            print(f"{name} causal={int(causal)}  " + "  ".join(cells))


if __name__ == "__main__":
    main()
