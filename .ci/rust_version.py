#!/usr/bin/env python3
"""Checks that Cargo.toml's rust-version is true: no dependency in the lock file asks for a
newer Rust than the package says it needs."""
import json, subprocess, sys


def version(text):
    parts = [int(p) for p in text.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))


meta = json.loads(subprocess.run(["cargo", "metadata", "--format-version", "1", "--locked"],
                                 check=True, capture_output=True, text=True).stdout)
members = set(meta["workspace_members"])
ours = next(p for p in meta["packages"] if p["id"] in members and p["name"] == "summon")
needed = [(version(p["rust_version"]), p["name"], p["rust_version"]) for p in meta["packages"]
          if p["id"] not in members and p["rust_version"]]
newest = max(needed)
print(f"rust-version {ours['rust_version']}; the newest a dependency asks for: {newest[2]} ({newest[1]})")
if newest[0] > version(ours["rust_version"]):
    sys.exit(f"Cargo.toml says rust-version {ours['rust_version']}, but {newest[1]} needs {newest[2]}")
