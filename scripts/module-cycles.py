#!/usr/bin/env python3
"""Lists cycles between the modules of one crate: `scripts/module-cycles.py crates/cli/src`.

A module uses another when its code (comments and string literals left out) names it by
path (`super::x`, `crate::x`, `crate::cli::x`). Prints each strongly connected component
of more than one module and exits 1 if there is any; ARCHITECTURE.md's rule is none.

It also checks the layering rules of the packages' manifests (given `crates/*/src`, the
manifests beside them): the command-line package (`crates/cli`) depends on no workspace
crate but the library `ucrypt` (dev-dependencies aside), and the library (`crates/core`)
never on the CLI's crates (clap, clap_complete, clap_mangen, indicatif, anyhow).
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


def dependencies(manifest):
    """The package names of a Cargo.toml's `[dependencies]` table (not dev or build)."""
    names, section = [], None
    with open(manifest) as fh:
        for line in fh:
            line = line.split("#", 1)[0].strip()
            if line.startswith("["):
                section = line.strip("[]").strip()
            elif section == "dependencies" and "=" in line:
                names.append(line.split("=", 1)[0].split(".", 1)[0].strip().strip('"'))
    return names


# The rules on the manifests: package directory -> (allowed workspace crates, forbidden crates).
CLI_LIBRARIES = {"clap", "clap_complete", "clap_mangen", "indicatif", "anyhow"}
LAYERS = {"cli": ({"ucrypt"}, set()), "core": (None, CLI_LIBRARIES)}


def layering(roots):
    """Messages for every manifest that breaks a rule of LAYERS."""
    out = []
    for root in roots:
        crate_dir = os.path.dirname(os.path.normpath(root))
        rule = LAYERS.get(os.path.basename(crate_dir))
        manifest = os.path.join(crate_dir, "Cargo.toml")
        if rule is None or not os.path.exists(manifest):
            continue
        allowed, forbidden = rule
        for dep in dependencies(manifest):
            if allowed is not None and dep.startswith("ucrypt") and dep not in allowed:
                out.append(f"{manifest}: depends on {dep}; it may use only {sorted(allowed)} of the workspace")
            if dep in forbidden:
                out.append(f"{manifest}: depends on {dep}, which only the command line may use")
    return out


def main():
    bad = False
    for root in sys.argv[1:]:
        for comp in cycles(edges(modules(root))):
            print(f"{root}: cycle: {' -> '.join(comp)}")
            bad = True
    for msg in layering(sys.argv[1:]):
        print(msg)
        bad = True
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
