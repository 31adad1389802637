"""Per-loop SASS statistics of one kernel: instruction mix of every loop body.

    python scripts/sass_loops.py KERNEL.cubin 'ForwardKernel.*Li128ELb0'

A loop is a backward branch (BRA to a lower address); for each, the number
of instructions and of the ones that matter in the attention kernels
(HMMA, LDSM, BAR, LDGSTS, MUFU, FMUL, LDL/STL). Needs cuobjdump on PATH (the
CUDA toolkit's, or the nvidia-cuda-cuobjdump wheel's). Used by
scripts/kernel_report.sh; static counts, so a loop's inner loops are counted
once.
"""

from __future__ import annotations

import re
import subprocess
import sys

WATCH = ("HMMA", "LDSM", "BAR", "LDGSTS", "MUFU", "FMUL", "LDL", "STL", "REDG")
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


def report(cubin: str, pattern: str) -> None:
    for function in functions(cubin):
        if not re.search(pattern, function):
            continue
        instrs = instructions(cubin, function)
        print(f"{short_name(function)}: {len(instrs)} instructions")
        for start, end, body in loops(instrs):
            ops = [opcode(text) for _, text in body]
            counts = ", ".join(f"{k} {ops.count(k)}" for k in WATCH if ops.count(k))
            print(f"  loop {start:#x}-{end:#x}: {len(body)} instructions; {counts}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    report(sys.argv[1], sys.argv[2])
