"""How long the gateway takes to choose a call's branch for a 100k-token prompt.

Run: .venv/bin/python bench/branch_bench.py [--chars 400000] [--calls 2000] [--wide]

One session holds the four branches of a Claude Code run (`sessions.max_branches`): the main
conversation (`--chars` characters, about 100k tokens at four a token), a sub-agent sharing its
first tool, a title and a quota call. Each timed call is the main conversation's next turn (a
new string, as the gateway builds one per call): `PrefixBranches.branch_covered` plus
`remember`, the index's whole work for a call. Prints p50, p99 and max in microseconds of wall
clock, and p50 and p99 of the thread's CPU time (which a busy machine's preemption leaves out), then the
sub-agent's turn (the branch it shares least with is compared in full), with the load average.
`--wide` puts one character past Latin-1 (an em dash) in the first turn, so every prompt is
stored two bytes a character.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from talariad.calls.branches import PrefixBranches, Prompt  # noqa: E402

WORDS = "the file test build patch read write edit run command output error line path".split()


def text(n: int, seed: int) -> str:
    rng = random.Random(seed)
    out, size = [], 0
    while size < n:
        w = rng.choice(WORDS)
        out.append(w)
        size += len(w) + 1
    return " ".join(out)[:n]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chars", type=int, default=400_000)
    ap.add_argument("--calls", type=int, default=2_000)
    ap.add_argument("--wide", action="store_true")
    args = ap.parse_args()
    agent_tool = "<|tools|> Agent " + text(2_500, 1) + "\n"
    head = agent_tool + "<|tools|> Bash " + text(40_000, 2) + "\n<|system|> " + text(12_000, 3)
    head += "\n"
    first = "<|user|> change the greeting \u2014 carefully\n" if args.wide else "<|user|> go\n"
    history = text(args.chars - len(head) - len(first), 4)
    b = PrefixBranches(max_branches=4)
    sub = Prompt(agent_tool + "<|tools|> Read " + text(20_000, 5) + "\n<|user|> go\n", 0, 10)
    for p in (Prompt("<|user|> quota\n", 0, 15), Prompt("<|system|> title\n", 0, 17), sub):
        name, _ = b.branch_covered("s", "m", p)
        b.remember("s", "m", name, p, "ok")
    prompt = Prompt(head + first + history, len(head), len(head) + len(first))
    name, _ = b.branch_covered("s", "m", prompt)
    b.remember("s", "m", name, prompt, " answer")
    times, cpu = [], []
    for n in range(args.calls):
        nxt = prompt.text + f" answer turn {n}\n"  # a fresh string, as the gateway builds one
        p = Prompt(nxt, prompt.head, prompt.first)
        t0, c0 = time.perf_counter(), time.thread_time()
        got, covered = b.branch_covered("s", "m", p)
        b.remember("s", "m", got, p, " answer")
        times.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
        assert got == name and covered >= len(prompt.text)
        prompt = p
    times.sort()
    cpu.sort()

    def us(xs: list[float], q: float) -> float:
        return xs[min(len(xs) - 1, int(q * len(xs)))] * 1e6

    print(
        f"main turn, {len(prompt.text):,} chars, {len(b.names('s', 'm'))} branches: "
        f"wall p50 {us(times, 0.5):.1f} us  p99 {us(times, 0.99):.1f} us  "
        f"max {times[-1] * 1e6:.1f} us; thread CPU p50 {us(cpu, 0.5):.1f} us  "
        f"p99 {us(cpu, 0.99):.1f} us"
    )
    subs = []
    for n in range(200):
        p = Prompt(sub.text + f" turn {n}\n", 0, 10)
        t0 = time.perf_counter()
        b.branch_covered("s", "m", p)
        subs.append(time.perf_counter() - t0)
        sub = p
    subs.sort()
    print(
        f"sub-agent turn: p50 {subs[100] * 1e6:.1f} us  p99 {subs[198] * 1e6:.1f} us; "
        f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs"
    )


if __name__ == "__main__":
    main()
