"""Local-memory accesses (STL/LDL) of the warp-specialized sm90 kernels, by role and place.

    python scripts/sm90_locals.py BINARY_OR_SASS [NAME_REGEX]

For each kernel (default: the sm90 ForwardKernels) of a binary (through
cuobjdump -sass) or of a saved cuobjdump -sass listing: the STL/LDL
instructions of the producer (code reachable from USETMAXREG.DEALLOC, the
setmaxnreg.dec), of the consumers (reachable from USETMAXREG.TRY_ALLOC) outside
and inside their key-block loops, and of the common prologue; the highest
register each role names; and the SASS instruction count of the key-block
loops. Those are the natural loops (a back edge to a dominating block) that
hold HGMMA and contain no other such loop, i.e. the consumers' per-block
loops, with their cold blocks wherever ptxas placed them. A producer spill
costs the one copy-issuing thread little; one inside the consumers' loops is
paid on every key block.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict

LINE = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
GUARD = re.compile(r"^@!?U?P\w+\s+")


def listing(path: str) -> str:
    if path.endswith(".sass") or path.endswith(".txt"):
        return open(path).read()
    return subprocess.run(["cuobjdump", "-sass", path], capture_output=True, text=True, check=True).stdout


def functions(text: str) -> dict[str, list[tuple[int, str]]]:
    funcs: dict[str, list[tuple[int, str]]] = {}
    current = None
    for line in text.splitlines():
        if "Function :" in line:
            current = line.split("Function :")[1].strip()
            funcs[current] = []
        elif current is not None and (m := LINE.match(line)):
            funcs[current].append((int(m.group(1), 16), m.group(2)))
    return funcs


def analyze(ins: list[tuple[int, str]]) -> dict:
    """Basic blocks, their successors, reachability from each setmaxnreg, and natural loops."""
    index = {addr: i for i, (addr, _) in enumerate(ins)}
    n = len(ins)
    leaders, jump = {0}, {}
    for i, (_, text) in enumerate(ins):
        core = GUARD.sub("", text)
        op = core.split()[0] if core else ""
        if op.startswith(("BRA", "BRX", "JMP", "CALL", "EXIT", "RET", "BPT")):
            m = re.search(r"0x([0-9a-f]+)\s*$", core)
            if m and op.startswith(("BRA", "JMP")) and int(m.group(1), 16) in index:
                jump[i] = index[int(m.group(1), 16)]
                leaders.add(jump[i])
            if i + 1 < n:
                leaders.add(i + 1)
    starts = sorted(leaders)
    blocks = [(s, starts[k + 1] if k + 1 < len(starts) else n) for k, s in enumerate(starts)]
    block_of = {i: k for k, (s, e) in enumerate(blocks) for i in range(s, e)}
    succ: dict[int, set[int]] = defaultdict(set)
    for k, (s, e) in enumerate(blocks):
        last = ins[e - 1][1]
        core = GUARD.sub("", last)
        op = core.split()[0] if core else ""
        if e - 1 in jump:
            succ[k].add(block_of[jump[e - 1]])
        # Falls through unless an unconditional jump or exit (a predicate
        # operand, "BRA P1, target", also makes it conditional).
        ends = op.startswith(("BRA", "BRX", "JMP", "EXIT", "RET")) and not last.startswith("@") and not re.match(
            r"\S+\s+!?U?P\d", core)
        if not ends and e < n:
            succ[k].add(block_of[e])
    pred: dict[int, set[int]] = defaultdict(set)
    for k, ss in list(succ.items()):
        for s in ss:
            pred[s].add(k)

    def reach(start: list[int]) -> set[int]:
        seen, stack = set(), list(start)
        while stack:
            k = stack.pop()
            if k not in seen:
                seen.add(k)
                stack.extend(succ[k])
        return seen

    live = reach([0])
    dom = {k: set(live) for k in live}
    dom[0] = {0}
    changed = True
    while changed:
        changed = False
        for k in sorted(live - {0}):
            ps = [dom[p] for p in pred[k] if p in live]
            new = (set.intersection(*ps) if ps else set()) | {k}
            if new != dom[k]:
                dom[k], changed = new, True
    loops: dict[int, set[int]] = defaultdict(set)
    for u in live:
        for v in succ[u]:
            if v in dom[u]:  # back edge u -> v: the natural loop of header v
                body, stack = {v}, [u]
                while stack:
                    x = stack.pop()
                    if x not in body:
                        body.add(x)
                        stack.extend(p for p in pred[x] if p in live)
                loops[v] |= body

    def holds(body: set[int], pattern: str) -> bool:
        return any(re.search(pattern, ins[i][1]) for k in body for i in range(*blocks[k]))

    mma = {v: b for v, b in loops.items() if holds(b, r"HGMMA")}
    inner = [b for v, b in mma.items() if not any(w != v and c < b for w, c in mma.items())]
    in_loop = set().union(*inner) if inner else set()
    producer = reach([block_of[i] for i, (_, t) in enumerate(ins) if "USETMAXREG.DEALLOC" in t])
    consumer = reach([block_of[i] for i, (_, t) in enumerate(ins) if re.search(r"USETMAXREG\.(TRY_)?ALLOC", t)])
    counts: dict[str, int] = defaultdict(int)
    highest = {"producer": -1, "consumer": -1}
    for k in live:
        role = ("producer" if k not in consumer else "both") if k in producer else (
            "consumer" if k in consumer else "prologue")
        for i in range(*blocks[k]):
            text = ins[i][1]
            if role in highest:
                for r in re.findall(r"\bR(\d+)\b", text):
                    highest[role] = max(highest[role], int(r))
            if re.search(r"\b(STL|LDL)", text):
                counts[role + (" loop" if role == "consumer" and k in in_loop else "")] += 1
    return {
        "instructions": n,
        "locals": dict(counts),
        "highest": highest,
        "loops": sorted(sum(blocks[k][1] - blocks[k][0] for k in b) for b in inner),
    }


def short(name: str) -> str:
    m = re.search(r"ForwardKernelI(\w+?)Li(\d+)ELi(\d+)ELNS1_8ScheduleE(\d)ELNS1_8FeaturesE(\d+)", name)
    if not m:
        return name[:80]
    dtype = {"13__nv_bfloat16": "bf16", "6__half": "f16"}.get(m.group(1), m.group(1))
    schedule = ["serial", "overlap", "pingpong"][int(m.group(4))]
    features = ["plain", "masks", "softcap", "bias", "bias16", "boolean", "dropout", "softcap_only", "plain_softcap", "plain_dropout", "bias_tiles"][int(m.group(5))]
    return f"{dtype} H{m.group(2)} N{m.group(3)} {schedule} {features}"


def main() -> None:
    pattern = re.compile(sys.argv[2] if len(sys.argv) > 2 else r"sm90\d*ForwardKernel")
    for name, ins in sorted(functions(listing(sys.argv[1])).items(), key=lambda f: short(f[0])):
        if not pattern.search(name):
            continue
        r = analyze(ins)
        c = r["locals"]
        print(f"  {short(name)}: local accesses producer {c.get('producer', 0)}, consumer {c.get('consumer', 0)}"
              f" + {c.get('consumer loop', 0)} in the key-block loops, prologue {c.get('prologue', 0)};"
              f" highest register producer R{r['highest']['producer']}, consumer R{r['highest']['consumer']};"
              f" key-block loops {'+'.join(map(str, r['loops']))} of {r['instructions']} instructions")


if __name__ == "__main__":
    main()
