#!/usr/bin/env bash
# Build llama.cpp's `llama-server` and `llama-bench` from the llama-cpp-python source distribution on PyPI (it vendors
# llama.cpp), for benchmarks/serve_bench.py's side-by-side runs. Needs a C/C++ compiler; cmake comes from PyPI when
# the machine has none. Nothing is downloaded besides the PyPI packages (the web UI, which llama.cpp would fetch
# from elsewhere, is left out).
#
# Usage: bash benchmarks/build_llama_server.sh [VERSION] [PREFIX]
#   VERSION  llama-cpp-python release (default 0.3.36)
#   PREFIX   where the build goes (default ${XDG_CACHE_HOME:-~/.cache}/agentbolt/llama.cpp/VERSION)
# Prints the path of llama-server on its last line. Takes 10-40 minutes on 2 cores.
set -euo pipefail

VERSION="${1:-0.3.36}"
PREFIX="${2:-${XDG_CACHE_HOME:-$HOME/.cache}/agentbolt/llama.cpp/$VERSION}"
PYTHON="${PYTHON:-python3}"
SERVER="$PREFIX/src/vendor/llama.cpp/build/bin/llama-server"

if [ -x "$SERVER" ]; then
  echo "$SERVER"
  exit 0
fi
mkdir -p "$PREFIX"
cd "$PREFIX"
if [ ! -d src ]; then
  "$PYTHON" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d sdist
  tar xzf "sdist/llama_cpp_python-$VERSION.tar.gz"
  mv "llama_cpp_python-$VERSION" src
fi
if ! command -v cmake >/dev/null 2>&1; then
  "$PYTHON" -m venv tools
  tools/bin/pip install --quiet cmake ninja
  export PATH="$PREFIX/tools/bin:$PATH"
fi
cd src/vendor/llama.cpp
cmake -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF >/dev/null
cmake --build build --target llama-server llama-bench -j "$(nproc)" >/dev/null
echo "$SERVER"
