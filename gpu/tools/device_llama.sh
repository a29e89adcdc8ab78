#!/usr/bin/env bash
# device_llama.sh — llama.cpp's CUDA backend on the same machine and the same
# bench files as ours, so the H200 figures are side-by-side ratios (issue 19:
# "build llama.cpp there too and run both, interleaved").
#
#   bash gpu/tools/device_llama.sh build SRC.tar.gz      # ~minutes, 16 cores
#   bash gpu/tools/device_llama.sh bench MODEL.gguf DEPTHS PROMPTS REPS
#
# SRC.tar.gz: the llama.cpp sources vendored in llama-cpp-python 0.3.36 (the
# version the CPU bench uses), pruned to what llama-bench needs (made on the
# development machine by gpu/tools/make_llama_tarball.sh). Built for sm_90 only, CUDA graphs
# on (its default), flash attention compiled (the default set of KV types).
# `bench` runs llama-bench with the issue's settings (flash attention on, all
# layers on the GPU) and prints its markdown table: tg128 at each depth,
# pp at each prompt size.
set -u
LL=/tmp/llama.cpp
case "${1:-}" in
build)
  rm -rf "$LL" && mkdir -p "$LL" && tar xzf "$2" -C "$LL" || exit 1
  cmake -S "$LL" -B "$LL/build" -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DGGML_CUDA_NCCL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_BUILD_APP=OFF -DGGML_NATIVE=ON > "$LL/configure.log" 2>&1 \
    || { tail -30 "$LL/configure.log"; exit 1; }
  cmake --build "$LL/build" --target llama-bench -j "$(nproc)" > "$LL/build.log" 2>&1 \
    || { tail -40 "$LL/build.log"; exit 1; }
  ls -la "$LL/build/bin/llama-bench"
  ;;
bench)
  # prefill from an empty context, then decode at each depth (one run with
  # both lists would also time every prefill size at every depth)
  "$LL/build/bin/llama-bench" -m "$2" -ngl 99 -fa 1 -n 0 -p "$4" -r "${5:-2}" -o md
  "$LL/build/bin/llama-bench" -m "$2" -ngl 99 -fa 1 -p 0 -n 128 -d "$3" -r "${5:-2}" -o md
  ;;
*)
  echo "usage: $0 build SRC.tar.gz | bench MODEL.gguf DEPTHS PROMPTS [REPS]"; exit 2 ;;
esac
