#!/usr/bin/env bash
# Runs the fuzz targets (fuzz_targets/*.rs: recipe, agent, pipeline, template) with libFuzzer
# for a bounded time each, on stable Rust, and reports executions and crashes per target.
#
# usage: bash fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]      (default: 25 s, every target)
#
# The targets are built the way `cargo fuzz build --sanitizer none` builds them (coverage
# instrumentation through stable `-C` flags; no nightly needed), into fuzz/target. Each run
# starts from a seed corpus copied at run time from the repository's own recipes, pipelines
# and fixtures and, when present, ../shared/corpus (never committed: fuzz/corpus is ignored).
# A crash leaves its input in fuzz/artifacts/TARGET/ and makes the script exit 1; reproduce
# it with `fuzz/target/x86_64-unknown-linux-gnu/release/TARGET FILE`, then add the input to
# a regression test.
#
# With SUMMON_FIGURES=FILE, one JSON line per target is appended to FILE:
#   {"kind":"fuzz","target":"recipe","seconds":25,"execs":N,"crashes":0}
# With a nightly toolchain and cargo-fuzz, `cargo +nightly fuzz run recipe` works as well.
set -euo pipefail
if [ -n "${SUMMON_FIGURES:-}" ]; then
  SUMMON_FIGURES=$(realpath -m "$SUMMON_FIGURES")
fi
cd "$(dirname "$0")"

seconds=${1:-25}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(recipe agent pipeline template)
fi

triple=$(rustc -vV | sed -n 's/^host: //p')
flags=(
  -Cpasses=sancov-module
  -Cllvm-args=-sanitizer-coverage-level=4
  -Cllvm-args=-sanitizer-coverage-inline-8bit-counters
  -Cllvm-args=-sanitizer-coverage-pc-table
  -Cllvm-args=-sanitizer-coverage-trace-compares
  -Cllvm-args=-sanitizer-coverage-stack-depth
  --cfg fuzzing
  -Cdebug-assertions
)
echo "fuzz: building ${targets[*]} ($triple)"
# --target keeps the instrumentation off build scripts and proc macros, as cargo-fuzz does.
RUSTFLAGS="${flags[*]}" cargo build --quiet --release --target "$triple" \
  "${targets[@]/#/--bin=}"

# Seeds: the files each parser reads in real use (copied, so libFuzzer may add to the corpus).
seed() {
  local target=$1
  shift
  local dir="corpus/$target"
  mkdir -p "$dir"
  local file
  for pattern in "$@"; do
    for file in $pattern; do
      if [ -f "$file" ] && [ "$(wc -c < "$file")" -le 65536 ]; then
        cp "$file" "$dir/seed-$(printf '%s' "$file" | cksum | cut -d' ' -f1)"
      fi
    done
  done
}
shared=../../shared/corpus
status=0
for target in "${targets[@]}"; do
  case $target in
    recipe)
      seed recipe "../recipes/*" "../tests/fixtures/invalid/*.yaml" \
        "$shared/goose-recipes/*" "$shared/goose-recipes/subrecipes/*" ;;
    agent)
      seed agent "../tests/fixtures/invalid/*.md" "$shared/agents/*.md" \
        "$shared/goose-agents/*.md" ;;
    pipeline)
      seed pipeline "../pipelines/*" "../tests/fixtures/invalid_pipelines/*.yaml" ;;
    template)
      seed template "../recipes/*" "../pipelines/*" "../tests/fixtures/invalid/*.yaml" ;;
    *)
      echo "fuzz: unknown target $target" >&2
      exit 2 ;;
  esac
  artifacts="artifacts/$target"
  mkdir -p "$artifacts"
  before=$(find "$artifacts" -type f | wc -l)
  log="target/fuzz-$target.log"
  set +e
  "target/$triple/release/$target" "corpus/$target" \
    -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2048 -max_len=65536 \
    -print_final_stats=1 -artifact_prefix="$artifacts/" > "$log" 2>&1
  code=$?
  set -e
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  crashes=$(( $(find "$artifacts" -type f | wc -l) - before ))
  if [ "$code" -ne 0 ] && [ "$crashes" -eq 0 ]; then
    crashes=1
  fi
  echo "fuzz: $target: ${execs:-0} executions in ${seconds}s, $crashes crash(es)"
  if [ "$crashes" -ne 0 ]; then
    grep -E "panicked|ERROR|SUMMARY|Test unit written" "$log" | head -n 20 || true
    status=1
  fi
  if [ -n "${SUMMON_FIGURES:-}" ]; then
    printf '{"kind":"fuzz","target":"%s","seconds":%s,"execs":%s,"crashes":%s}\n' \
      "$target" "$seconds" "${execs:-0}" "$crashes" >> "$SUMMON_FIGURES"
  fi
done
exit $status
