#!/usr/bin/env python3
"""Lists cycles between the modules of one crate: `scripts/module-cycles.py crates/cli/src`.

A module uses another when its code (comments and string literals left out) names it by
path (`super::x`, `crate::x`, `crate::cli::x`). Prints each strongly connected component
of more than one module and exits 1 if there is any; ARCHITECTURE.md's rule is none.
"""
import os
import re
import sys


def code_of(src):
    """The source without comments and string literals (their text names no dependency)."""
    src = re.sub(r'"(?:\\.|[^"\\])*"', '""', src, flags=re.S)
    return "\n".join(line.split("//", 1)[0] for line in src.splitlines())


def modules(root):
    mods = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            if f.endswith(".rs"):
                path = os.path.join(dirpath, f)
                name = os.path.relpath(path, root)[:-3].replace("/", "::")
                if name.endswith("::mod"):
                    name = name[: -len("::mod")]
                with open(path) as fh:
                    mods[name] = code_of(fh.read())
    return mods


def edges(mods):
    out = {m: set() for m in mods}
    for m, src in mods.items():
        parent = "::".join(m.split("::")[:-1])
        for ref in re.findall(r"(?:super|crate::cli|crate)::([a-z_0-9]+)", src):
            for cand in ([parent + "::" + ref] if parent else []) + [ref, "cli::" + ref]:
                if cand in mods and cand != m:
                    out[m].add(cand)
                    break
    return out


def cycles(graph):
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    return found


def main():
    bad = False
    for root in sys.argv[1:]:
        for comp in cycles(edges(modules(root))):
            print(f"{root}: cycle: {' -> '.join(comp)}")
            bad = True
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
