#!/usr/bin/env bash
# llama-server and llama-bench built from source: the llama.cpp that PyPI's llama-cpp-python sdist
# vendors (PyPI is reachable where GitHub may not be), CPU only, into
# ~/.cache/codex_lab/llama.cpp/build (CODEX_LAB_LLAMA_CPP to change the parent folder).
# For the peer comparisons over HTTP (llama-server with parallel slots); the batch-1 and in-process
# 8-stream comparisons need only `scripts/get_llama_cpp.sh` (prebuilt, minutes).
# Takes tens of minutes on 2 cores (JOBS=N to change the parallel compile jobs; default: every core).
# Idempotent: a second run with the same version and flags does nothing but print them.
# Needs cmake >= 3.14, a C++17 compiler and make (Debian: apt-get install cmake g++ make), python3.
set -euo pipefail
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"  # the sdist whose vendored llama.cpp this course built (2026-12-03)
ROOT="${CODEX_LAB_LLAMA_CPP:-$HOME/.cache/codex_lab/llama.cpp}"
DIR="$ROOT/build"
JOBS="${JOBS:-$(nproc)}"
# CPU only, tuned for this machine (GGML_NATIVE: -march=native), no network client, no tests
FLAGS=(-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF
       -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON -DBUILD_SHARED_LIBS=OFF)
for tool in cmake make g++ python3; do
  command -v "$tool" >/dev/null || { echo "build_llama_cpp: $tool not found; apt-get install cmake g++ make python3" >&2; exit 2; }
done
stamp="llama-cpp-python $VERSION; flags ${FLAGS[*]}"
report() {
  echo "llama.cpp from $stamp"
  echo "commit: $(cat "$DIR/COMMIT" 2>/dev/null || echo unknown)"
  "$DIR/bin/llama-server" --version 2>&1 | head -3 || true
  echo "binaries: $DIR/bin/llama-server $DIR/bin/llama-bench"
}
if [ -x "$DIR/bin/llama-server" ] && [ -x "$DIR/bin/llama-bench" ] && [ "$(cat "$DIR/STAMP" 2>/dev/null)" = "$stamp" ]; then
  report
  exit 0
fi
mkdir -p "$DIR/src"
cd "$DIR/src"
sdist="llama_cpp_python-$VERSION.tar.gz"
if [ ! -s "$sdist" ]; then
  # pip fetches the sdist from the package index (it prepares its metadata, a minute, in an isolated env)
  python3 -m pip download --no-deps --no-binary :all: -d "$DIR/src" "llama-cpp-python==$VERSION"
fi
rm -rf "llama_cpp_python-$VERSION"
tar xzf "$sdist"
SRC="$DIR/src/llama_cpp_python-$VERSION/vendor/llama.cpp"
[ -f "$SRC/CMakeLists.txt" ] || { echo "build_llama_cpp: $sdist has no vendor/llama.cpp" >&2; exit 2; }
cmake -S "$SRC" -B "$DIR/cmake" "${FLAGS[@]}"
cmake --build "$DIR/cmake" --target llama-server llama-bench -j "$JOBS"
mkdir -p "$DIR/bin"
cp "$DIR/cmake/bin/llama-server" "$DIR/cmake/bin/llama-bench" "$DIR/bin/"
# the commit the sdist's llama.cpp was cut from, as the binary reports it ("version: ... commit 0c1e570")
( "$DIR/bin/llama-server" --version 2>&1 | grep -oE 'commit [0-9a-f]+' | head -1 | cut -d' ' -f2 ||
  echo "unknown" ) > "$DIR/COMMIT"
echo "$stamp" > "$DIR/STAMP"
report
