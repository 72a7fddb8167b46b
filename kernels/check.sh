#!/usr/bin/env bash
# Compile check of the GPU kernels on a machine with no GPU (run by .ci/run).
#
#   CUDA: kernels/*.cu -> cubin for sm_90a and sm_100a with nvcc from the PyPI wheels
#         nvidia-cuda-nvcc / nvidia-cuda-runtime / nvidia-cuda-cccl (pinned below), installed
#         once into $KQUANT_CUDA_HOME (default ~/.cache/kquant/cuda), outside the repo, with
#         nvidia-cuda-nvrtc (NVRTC, which .ci/run then gives the `--features cuda` unit test that
#         compiles the assembled module for every arch).
#   HIP:  the same sources as HIP (kernels/kq_vendor.h maps the CUDA spelling) -> an AMDGPU code
#         object for gfx940 (stand-in for gfx942/MI325X: Debian 12's LLVM 16 lacks gfx942) with
#         Debian's clang-16 + lld-16 (the AMDGPU linker) + libamdhip64-dev + rocm-device-libs
#         (apt-get, when root and the packages are available).
#
# Prints each target it built with its kernel count and resource use (ptxas -v: registers,
# spills; LLVM kernel-resource-usage remarks: VGPRs, occupancy, scratch); exits non-zero if any
# compile fails or a CUDA kernel spills. If the HIP packages cannot
# be installed it says so and still compiles CUDA (set KQUANT_REQUIRE_HIP=1 to make that fatal).
# Idempotent: a second run reuses the cached toolchains and only recompiles (seconds).
set -euo pipefail
cd "$(dirname "$0")"

# nvidia-cuda-nvcc, -runtime, -cccl, -nvrtc and the two wheels nvcc depends on (nvidia-nvvm: cicc;
# nvidia-cuda-crt), all pinned to one release: an unpinned nvvm 13.5 emits PTX 9.5 that the
# 13.2 ptxas refuses.
CUDA_VERSION_PIN="13.2.86"
CUDA_HOME_DIR="${KQUANT_CUDA_HOME:-$HOME/.cache/kquant/cuda}"
OUT="${KQUANT_KERNEL_OUT:-$(mktemp -d)}"
SOURCES=(w4_gemv.cu w4_mma.cu w4_dense.cu argmax.cu ops.cu)
CUDA_ARCHS=(sm_90a sm_100a)
HIP_ARCHS=(gfx940)
failed=0

# The single translation unit NVRTC / hipRTC get at run time (src/gpu/source.rs `module()`): the
# two headers, then every kernel file, without the local includes and `#pragma once`. Compiled
# below for the first CUDA and HIP arch, to catch clashes between the files.
MODULE="$OUT/kquant_module.cu"
for f in kq_vendor.h kq_tune.h "${SOURCES[@]}"; do
    grep -v -e '^#include "kq_vendor.h"' -e '^#include "kq_tune.h"' -e '^#pragma once' "$f"
done >"$MODULE"

# ---------------------------------------------------------------- CUDA toolchain (pip, cached)
stamp="$CUDA_HOME_DIR/.installed-$CUDA_VERSION_PIN-nvrtc"
if [ ! -f "$stamp" ]; then
    echo "check.sh: installing nvcc $CUDA_VERSION_PIN (PyPI) into $CUDA_HOME_DIR"
    rm -rf "$CUDA_HOME_DIR"
    mkdir -p "$CUDA_HOME_DIR"
    python3 -m venv "$CUDA_HOME_DIR/venv"
    "$CUDA_HOME_DIR/venv/bin/pip" install --quiet --disable-pip-version-check \
        "nvidia-cuda-nvcc==$CUDA_VERSION_PIN" \
        "nvidia-cuda-runtime==$CUDA_VERSION_PIN" \
        "nvidia-cuda-cccl==$CUDA_VERSION_PIN" \
        "nvidia-nvvm==$CUDA_VERSION_PIN" \
        "nvidia-cuda-crt==$CUDA_VERSION_PIN" \
        "nvidia-cuda-nvrtc==$CUDA_VERSION_PIN"
    touch "$stamp"
fi
NVCC="$(find "$CUDA_HOME_DIR/venv" -path '*/bin/nvcc' -type f | head -n1)"
if [ -z "$NVCC" ]; then
    echo "check.sh: FAIL: no nvcc in the nvidia-cuda-nvcc wheel under $CUDA_HOME_DIR" >&2
    exit 1
fi
CUDA_ROOT="$(dirname "$(dirname "$NVCC")")"   # .../site-packages/nvidia/cu13
NV="$(dirname "$CUDA_ROOT")"                    # .../site-packages/nvidia
CUDA_INC=()
for d in "$NV"/*/include "$NV"/*/include/cccl; do [ -d "$d" ] && CUDA_INC+=("-I$d"); done
export PATH="$CUDA_ROOT/bin:$PATH"
echo "check.sh: nvcc: $("$NVCC" --version | tail -n1)"

cuda_jobs=()
for src in "${SOURCES[@]}"; do
    for arch in "${CUDA_ARCHS[@]}"; do cuda_jobs+=("$src:$arch"); done
done
cuda_jobs+=("$MODULE:${CUDA_ARCHS[0]}")
for job in "${cuda_jobs[@]}"; do
    src="${job%:*}" arch="${job##*:}"
    out="$OUT/$(basename "${src%.cu}").$arch.cubin"
    t0=$(date +%s%N)
    if "$NVCC" -std=c++17 -O3 --cubin -arch="$arch" -I. "${CUDA_INC[@]}" \
        -Xptxas -v,-warn-spills -Werror all-warnings "$src" -o "$out" 2>"$out.log"; then
        regs=$(awk '/Used [0-9]+ registers/ { for (i = 1; i <= NF; i++) if ($i == "Used" && $(i+1) > r) r = $(i+1); k++ }
                    / [1-9][0-9]* bytes spill/ { s++ }
                    END { printf "%d kernels, max %d registers/thread, %d with spills", k, r, s }' "$out.log")
        printf 'check.sh: built CUDA %-16s %-8s -> %s (%s bytes, %sms; %s)\n' "$(basename "$src")" "$arch" \
            "$(basename "$out")" "$(stat -c %s "$out")" "$(( ($(date +%s%N) - t0) / 1000000 ))" "$regs"
    else
        echo "check.sh: FAIL CUDA $src $arch" >&2
        cat "$out.log" >&2
        failed=1
    fi
done

# ---------------------------------------------------------------- HIP toolchain (apt, Debian 12)
hip_ok=1
if ! command -v clang++-16 >/dev/null || [ ! -x /usr/lib/llvm-16/bin/lld ] \
    || [ ! -f /usr/include/hip/hip_runtime.h ] \
    || ! ls /usr/lib/x86_64-linux-gnu/amdgcn/bitcode/ocml.bc >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "check.sh: installing clang-16 lld-16 libamdhip64-dev rocm-device-libs (apt-get)"
        if ! { apt-get update -qq >/dev/null 2>&1 &&
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
                clang-16 lld-16 libamdhip64-dev rocm-device-libs >/dev/null 2>&1; }; then
            hip_ok=0
        fi
    else
        hip_ok=0
    fi
fi
BITCODE=/usr/lib/x86_64-linux-gnu/amdgcn/bitcode
if [ "$hip_ok" = 1 ] && command -v clang++-16 >/dev/null && [ -f /usr/include/hip/hip_runtime.h ] \
    && [ -d "$BITCODE" ]; then
    hip_jobs=()
    for src in "${SOURCES[@]}"; do
        for arch in "${HIP_ARCHS[@]}"; do hip_jobs+=("$src:$arch"); done
    done
    hip_jobs+=("$MODULE:${HIP_ARCHS[0]}")
    for job in "${hip_jobs[@]}"; do
        src="${job%:*}" arch="${job##*:}"
        out="$OUT/$(basename "${src%.cu}").$arch.hsaco"
        t0=$(date +%s%N)
        if clang++-16 -x hip -std=c++17 --cuda-device-only --no-gpu-bundle-output \
            --offload-arch="$arch" --rocm-device-lib-path="$BITCODE" \
            -I. -O3 -Wall -Werror -Rpass-analysis=kernel-resource-usage \
            -c "$src" -o "$out" 2>"$out.log"; then
            # LLVM's kernel-resource-usage remarks: one "Function Name" block per kernel.
            res=$(awk -F': ' '/remark: Function Name:/ { k++ }
                        /remark: +VGPRs: / { v = $NF + 0; if (v > mv) mv = v }
                        /remark: +ScratchSize/ { s = $NF + 0; if (s > ms) ms = s; if (s > 0) ns++ }
                        /remark: +VGPRs Spill: / { if ($NF + 0 > 0) sp++ }
                        /remark: +Occupancy/ { o = $NF + 0; if (mo == "" || o < mo) mo = o }
                        END { printf "%d kernels, max %d VGPRs, min occupancy %d waves/SIMD, %d with scratch (max %d B/lane), %d with VGPR spills", k, mv, mo, ns, ms, sp }' "$out.log")
            printf 'check.sh: built HIP  %-16s %-8s -> %s (%s bytes, %sms; %s)\n' "$(basename "$src")" "$arch" \
                "$(basename "$out")" "$(stat -c %s "$out")" "$(( ($(date +%s%N) - t0) / 1000000 ))" "$res"
        else
            echo "check.sh: FAIL HIP $src $arch" >&2
            cat "$out.log" >&2
            failed=1
        fi
    done
else
    echo "check.sh: HIP SKIPPED: clang-16 / lld-16 / libamdhip64-dev / rocm-device-libs (Debian 12) are not" \
        "installed and could not be installed here; only CUDA was compiled" >&2
    if [ "${KQUANT_REQUIRE_HIP:-0}" = 1 ]; then failed=1; fi
fi

if [ "$failed" != 0 ]; then
    echo "check.sh: FAILED" >&2
    exit 1
fi
echo "check.sh: ok (outputs in $OUT)"
