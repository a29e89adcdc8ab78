#!/usr/bin/env bash
# make_llama_tarball.sh — the llama.cpp sources that `device_llama.sh build`
# compiles on the GPU machine, made on the development machine from the
# llama-cpp-python sdist the CPU bench uses (the same llama.cpp version on
# both sides of issue 18's and issue 19's comparisons).
#
#   bash gpu/tools/make_llama_tarball.sh SDIST.tar.gz OUT.tar.gz
#
# SDIST: llama_cpp_python-0.3.36.tar.gz (`pip download --no-binary :all:
# --no-deps llama-cpp-python==0.3.36`). The tree is pruned to what
# llama-bench needs (the whole vendored tree is ~176 MB, over the device
# tool's 64 MiB working-tree limit; this leaves ~23 MB, ~3.5 MB gzipped):
# no models, docs, tests, examples, Python tooling or other GPU backends, and
# tools/CMakeLists.txt reduced to llama-bench. Carry OUT's folder to the
# device (`carry`) and run `device_llama.sh build OUT.tar.gz` there.
set -eu
sdist=$1
out=$(cd "$(dirname "$2")" && pwd)/$(basename "$2") # absolute: the script cds below
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tar xzf "$sdist" -C "$tmp"
src=$(echo "$tmp"/*/vendor/llama.cpp)
[ -f "$src/CMakeLists.txt" ] || { echo "no vendor/llama.cpp in $sdist" >&2; exit 1; }
cd "$src"
rm -rf models docs media examples pocs benches tests gguf-py conversion scripts app skills
find tools -mindepth 1 -maxdepth 1 ! -name llama-bench ! -name CMakeLists.txt -exec rm -rf {} +
printf 'find_package(Threads REQUIRED)\nllama_add_compile_flags()\nadd_subdirectory(llama-bench)\n' \
  > tools/CMakeLists.txt
(cd ggml/src && rm -rf ggml-et ggml-metal ggml-hexagon ggml-sycl ggml-vulkan ggml-opencl \
  ggml-cann ggml-musa ggml-webgpu ggml-zdnn ggml-openvino ggml-virtgpu)
tar czf "$out.tmp" -C "$src" . && mv "$out.tmp" "$out" # atomic: no half-written tarball
ls -la "$out"
