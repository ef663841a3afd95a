#!/usr/bin/env python3
"""Checks the one-way layers of ARCHITECTURE.md across the workspace:

- every crate's path dependencies lie on lower crate layers (Cargo refuses a circle between
  crates, not a dependency that goes up a layer);
- in dpo-train's own crate, every `crate::` / `super::` path (tests excluded) leads to a module of
  the same top-level module or of a lower layer;
- in every crate, no two source files import each other, directly or around a circle (a module
  counts as using the modules it declares).

    python3 tools/layers.py            # exit 0 when clean, 1 with one line per violation

Layers of dpo-train's own modules, low to high (the crates it re-exports lie below them all):
"""

import tomllib

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The workspace's crates, low to high: a crate may depend only on crates of lower layers.
CRATE_LAYERS = {
    "dpo-base": 0, "dpo-vocab": 0, "hf-config": 0,
    "dpo-torch": 1, "dpo-config": 1, "check-gpu": 1,
    "dpo-dist": 2, "dpo-data": 2,
    "dpo-model": 3,
    "dpo-train": 4,
}

# dpo-train: top-level module -> layer. Two modules on one layer may not use each other.
LAYERS = {
    "malloc": 0, "tboard": 0, "wandb": 0,
    "dpo": 4,
    "train": 5,
    "report": 6,
    "demo": 7, "eval": 7,
    "run": 8,
    "cli": 9,
}
__doc__ += "".join(f"    {layer}: {', '.join(sorted(m for m, l in LAYERS.items() if l == layer))}\n"
                   for layer in sorted(set(LAYERS.values())))

MANIFESTS = [ROOT / "Cargo.toml"] + sorted((ROOT / "crates").glob("*/Cargo.toml"))
PATH = re.compile(r"\b(crate|super|self)((?:::(?:\w+|\{[^;]*?\}))+)")
DECLARED = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", re.M)


def strip(text):
    """The code without comments, string literals and the trailing `#[cfg(test)]` modules."""
    cut = text.find("#[cfg(test)]")
    text = text if cut < 0 else text[:cut]
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    text = re.sub(r'r#*"(?:.|\n)*?"#*', '""', text)
    return re.sub(r'"(?:\\.|[^"\\])*"', '""', text)


def module_of(crate, path):
    """`src/a/b.rs` or `src/a/b/mod.rs` -> ("a", "b"); lib.rs / main.rs -> ()."""
    parts = list(path.relative_to(crate).with_suffix("").parts)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return tuple(parts)


def expand(tail):
    """`::a::{b, c::{d}}` -> [[a, b], [a, c, d]] (a `self` inside braces names the prefix)."""
    tail = tail.strip()
    if not tail.startswith("::"):
        return [[]]
    tail = tail[2:]
    if tail.startswith("{"):
        inner, depth, items, cur = tail[1:-1], 0, [], ""
        for ch in inner:
            depth += (ch == "{") - (ch == "}")
            if ch == "," and depth == 0:
                items.append(cur)
                cur = ""
            else:
                cur += ch
        items.append(cur)
        out = []
        for item in filter(str.strip, items):
            item = item.strip()
            out += [[] if item == "self" else p for p in expand("::" + item)]
        return out
    head, _, rest = tail.partition("::")
    head = head.split(" as ")[0].strip()
    return [[head] + p for p in expand("::" + rest if rest else "")]


def resolve(modules, base, segments):
    """The deepest module named by `base + segments`."""
    path = list(base) + segments
    for n in range(len(path), -1, -1):
        if tuple(path[:n]) in modules:
            return tuple(path[:n])
    return ()


def check(crate, layers):
    files = {module_of(crate, f): f for f in crate.rglob("*.rs")}
    modules = set(files)
    edges, problems = {}, []
    for module, file in files.items():
        text = strip(file.read_text())
        # A module uses the modules it declares (`mod peak;`): using it may reach them.
        uses = {module + (child,) for child in DECLARED.findall(text) if module + (child,) in modules}
        for kind, tail in PATH.findall(text):
            base = {"crate": (), "self": module}.get(kind)
            if base is None:  # `super`: the parent of this file's module (of a mod.rs: its own parent)
                base = module[:-1]
            for segments in expand(tail):
                target = resolve(modules, base, segments)
                if target and target != module and target[: len(module)] != module:
                    uses.add(target)
        edges[module] = uses
        if not layers or not module:
            continue
        mine = layers.get(module[0])
        for target in sorted(uses):
            theirs = layers.get(target[0])
            if mine is None or theirs is None or target[0] == module[0]:
                continue
            if theirs >= mine:
                problems.append(f"{file.relative_to(ROOT)}: uses `{'::'.join(target)}` ({target[0]} is layer "
                                f"{theirs}, {module[0]} is layer {mine})")
    return problems + cycles(crate, files, edges)


def cycles(crate, files, edges):
    """Circles between source files: strongly connected components of more than one file."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            # A module and its own submodules are one unit (mod.rs re-exports its children).
            roots = {c for c in component if not any(c != d and c[: len(d)] == d for d in component)}
            if len(roots) > 1:
                names = ", ".join(str(files[c].relative_to(ROOT)) for c in sorted(component))
                out.append(f"circle: {names}")

    sys.setrecursionlimit(10_000)
    for v in list(edges):
        if v not in index:
            visit(v)
    return out


def crate_layers():
    """Every path dependency that does not go down a layer, and every crate without one."""
    problems = []
    for manifest in MANIFESTS:
        cargo = tomllib.loads(manifest.read_text())
        name = cargo["package"]["name"]
        mine = CRATE_LAYERS.get(name)
        if mine is None:
            problems.append(f"{manifest.relative_to(ROOT)}: crate {name} has no layer in tools/layers.py")
            continue
        for dep, spec in cargo.get("dependencies", {}).items():
            if isinstance(spec, dict) and "path" in spec:
                theirs = CRATE_LAYERS.get(dep)
                if theirs is None or theirs >= mine:
                    problems.append(f"{manifest.relative_to(ROOT)}: depends on {dep} (layer {theirs}), "
                                    f"{name} is layer {mine}")
    return problems


def main():
    problems = crate_layers()
    for manifest in MANIFESTS:
        name = tomllib.loads(manifest.read_text())["package"]["name"]
        problems += check(manifest.parent / "src", LAYERS if name == "dpo-train" else None)
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} layer violation(s); see ARCHITECTURE.md")
        return 1
    print("layers: one way, no circles")
    return 0


if __name__ == "__main__":
    sys.exit(main())
