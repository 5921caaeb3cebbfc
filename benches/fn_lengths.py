#!/usr/bin/env python3
"""Print the longest functions in a Rust source tree (default: src/exec/).

Usage: python3 benches/fn_lengths.py [DIR] [N]

A function runs from its `fn` line to the line of its matching closing brace.
Braces inside string and char literals and comments are ignored.
"""
import os
import re
import sys

FN = re.compile(r"^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?fn\s+(\w+)")


def strip(line, in_block):
    """Return the line without comments and literals, and whether a block comment stays open."""
    out = []
    i = 0
    n = len(line)
    while i < n:
        if in_block:
            end = line.find("*/", i)
            if end < 0:
                return "".join(out), True
            i = end + 2
            in_block = False
            continue
        c = line[i]
        if line.startswith("//", i):
            break
        if line.startswith("/*", i):
            in_block = True
            i += 2
            continue
        if c == '"':
            i += 1
            while i < n and line[i] != '"':
                i += 2 if line[i] == "\\" else 1
            i += 1
            continue
        if c == "'" and re.match(r"'(\\.|[^\\'])'", line[i:]):
            i += len(re.match(r"'(\\.|[^\\'])'", line[i:]).group(0))
            continue
        out.append(c)
        i += 1
    return "".join(out), in_block


def functions(path):
    lines = open(path, encoding="utf-8").read().split("\n")
    clean = []
    in_block = False
    for line in lines:
        text, in_block = strip(line, in_block)
        clean.append(text)
    # raw strings r#"..."# spanning lines are rare in exec/; tolerate them.
    for start, text in enumerate(clean):
        m = FN.match(text)
        if not m:
            continue
        depth = 0
        opened = False
        for end in range(start, len(clean)):
            for ch in clean[end]:
                if ch == "{":
                    depth += 1
                    opened = True
                elif ch == "}":
                    depth -= 1
            if not opened and ";" in clean[end]:
                break  # a declaration without a body
            if opened and depth == 0:
                yield m.group(6), start + 1, end - start + 1
                break


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "src/exec"
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    found = []
    for dirpath, _, files in os.walk(root):
        for name in files:
            if name.endswith(".rs"):
                path = os.path.join(dirpath, name)
                for fn, line, length in functions(path):
                    found.append((length, fn, f"{path}:{line}"))
    found.sort(reverse=True)
    print(f"{'lines':>6}  {'function':<28} where")
    for length, fn, where in found[:top]:
        print(f"{length:>6}  {fn:<28} {where}")
    print(f"{sum(l for l, _, _ in found[:top]):>6}  (sum of the {top} longest)")
    print(f"integration test binaries: {test_binaries()}")


def test_binaries():
    """Cargo's integration test targets: one per `tests/*.rs` file (a `[[test]]` entry only
    configures one of them), unless `autotests = false` leaves only the `[[test]]` entries."""
    manifest = open("Cargo.toml").read() if os.path.exists("Cargo.toml") else ""
    declared = len(re.findall(r"(?m)^\[\[test\]\]", manifest))
    if re.search(r"(?m)^autotests\s*=\s*false", manifest):
        return declared
    files = [f for f in os.listdir("tests") if f.endswith(".rs")] if os.path.isdir("tests") else []
    return len(files)


if __name__ == "__main__":
    main()
