"""Per-loop SASS statistics of one kernel: instruction mix of every loop body.

    python scripts/sass_loops.py KERNEL.cubin 'ForwardKernel.*Li128ELb0'

A loop is a backward branch (BRA to a lower address); for each, the number
of instructions and of the ones that matter in the attention kernels
(HMMA, HGMMA, LDSM, BAR, LDGSTS, MUFU, FMUL, LDL/STL, R2UR, UBLKRED). Needs
cuobjdump on PATH (the CUDA toolkit's, or the nvidia-cuda-cuobjdump wheel's).
Used by scripts/kernel_report.sh; static counts, so a loop's inner loops are
counted once. "cheapest path": the instructions a warp issues through the
body when every conditional branch takes its shorter side and no inner loop
repeats (for the sm90 backward's step loop: a full step, a lane other than
0, no barrier retries: an estimate of a step's issue slots, where the static
count also holds the tail steps' code).
"""

from __future__ import annotations

import re
import subprocess
import sys

WATCH = ("HMMA", "LDSM", "BAR", "LDGSTS", "MUFU", "FMUL", "LDL", "STL", "REDG", "HGMMA", "R2UR", "UBLKRED")
LINE = re.compile(r"/\*([0-9a-f]{4,6})\*/\s+(.*?);")


def functions(cubin: str) -> list[str]:
    out = subprocess.run(["cuobjdump", "-sass", cubin], capture_output=True, text=True, check=True).stdout
    return re.findall(r"Function : (\S+)", out)


def instructions(cubin: str, function: str) -> list[tuple[int, str]]:
    out = subprocess.run(["cuobjdump", "-sass", "-fun", function, cubin], capture_output=True, text=True,
                         check=True).stdout
    return [(int(m.group(1), 16), m.group(2).strip()) for m in map(LINE.search, out.splitlines()) if m]


def short_name(function: str) -> str:
    """ForwardKernel<bf16, 128, 0> from its mangled name (for these kernels' shapes only)."""
    m = re.match(r"_ZN9jax_flash4cuda(?:4sm80)?\d+(\w+?)I(?:13__nv_bfloat16|6__half)(.*?)E+vNS_15AttentionParamsE",
                 function)
    if not m:
        return function
    args = re.findall(r"Li(\d+)E|Lb(\d)E?", m.group(2) + "E")
    return f"{m.group(1)}<" + ", ".join(a or b for a, b in args) + ">"


def opcode(text: str) -> str:
    words = text.split()
    word = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
    return word.split(".")[0]


def loops(instrs: list[tuple[int, str]]):
    """(start, end, body) for every backward branch, outermost last."""
    index = {addr: i for i, (addr, _) in enumerate(instrs)}
    for i, (addr, text) in enumerate(instrs):
        m = re.search(r"\bBRA\b.*?(0x[0-9a-f]+)", text)
        if m and int(m.group(1), 16) < addr and int(m.group(1), 16) in index:
            start = index[int(m.group(1), 16)]
            yield instrs[start][0], addr, instrs[start:i + 1]


def cheapest_path(body: list[tuple[int, str]]) -> int:
    """Instructions from the body's first to its last (the back edge), each
    conditional forward branch inside the body taking its shorter side; a
    branch out of the body or backwards (an inner loop, a wait's retry)
    falls through, and so does a BRA.DIV (ptxas's divergence check before a
    warp-collective such as __syncwarp: taken only by a diverged warp); an
    EXIT or an unconditional branch out ends nowhere."""
    index = {addr: i for i, (addr, _) in enumerate(body)}
    never = 1 << 60
    cost = [never] * (len(body) + 1)
    cost[len(body) - 1] = 1
    for i in range(len(body) - 2, -1, -1):
        addr, text = body[i]
        if opcode(text) == "EXIT":
            continue
        m = re.search(r"\bBRA\b.*?(0x[0-9a-f]+)", text)
        target = int(m.group(1), 16) if m else None
        inside = target is not None and target > addr and target in index
        taken = cost[index[target]] if inside else never
        if m is None or opcode(text) == "BRA" and text.split()[0].startswith("BRA.DIV"):
            best = cost[i + 1]
        elif not text.startswith("@"):
            best = taken
        else:
            best = min(taken, cost[i + 1])
        cost[i] = best + 1 if best < never else never
    return cost[0]


def report(cubin: str, pattern: str) -> None:
    for function in functions(cubin):
        if not re.search(pattern, function):
            continue
        instrs = instructions(cubin, function)
        print(f"{short_name(function)}: {len(instrs)} instructions")
        for start, end, body in loops(instrs):
            ops = [opcode(text) for _, text in body]
            counts = ", ".join(f"{k} {ops.count(k)}" for k in WATCH if ops.count(k))
            path = cheapest_path(body)
            path_text = f", cheapest path {path}" if path < 1 << 60 else ""
            print(f"  loop {start:#x}-{end:#x}: {len(body)} instructions{path_text}; {counts}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    report(sys.argv[1], sys.argv[2])
