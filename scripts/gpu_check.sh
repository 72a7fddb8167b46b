#!/usr/bin/env bash
# The prepared device check (docs/kernels.md, "The device check"): everything #30 needs a GPU for,
# in one run that ends inside a 10-minute device call. Two halves:
#
#   bash scripts/gpu_check.sh build       # HERE (no GPU): release binaries with --features cuda,
#                                         # stripped and gzipped into target/gpu-bin (carried)
#   bash scripts/gpu_check.sh stash       # HERE: move the fixtures the check does not read to
#                                         # ../kq-device-stash (the device call sends the working
#                                         # tree, at most 64 MiB; the whole tree is ~100 MB)
#   bash scripts/gpu_check.sh run         # ON THE DEVICE, from the repository root, $OUT set
#   bash scripts/gpu_check.sh unstash     # HERE, right after the call: put them back
#   bash scripts/gpu_check.sh --dry-run   # the steps and their time limits, nothing run
#
# The device call:  run(command="bash scripts/gpu_check.sh run", carry=["target/gpu-bin"],
#                       timeout_s=600)
#
# What `run` does, each step under its own time limit (the sum stays under 9 minutes) and logged
# to $OUT (at most 8 files come back): summary.txt (one line per step: name, exit status,
# seconds) and one log per group of steps.
#   libs       find NVRTC / cuBLAS (CUDA 12 or 13, e.g. PyTorch's nvidia-* wheels) and link them
#              under the names cudarc loads (libnvrtc.so, libcublas.so)
#   compile    bench gemm on one small shape twice with an empty KQUANT_KERNEL_CACHE: the first
#              process compiles the module (NVRTC), the second must load it from the cache; both
#              walls and the `kernels …` lines go to summary.txt
#   tier       the ::cuda tier of gpu_gemm, gpu_dense and gpu_linear at slice shapes
#   full       KQUANT_GPU_FULL_SHAPES=1: gpu_dense (the 163840 × 7168 lm_head) and the W4A16
#              regimes at the full Kimi shapes
#   gemm       bench gemm --device cuda --json over the Kimi shapes, M = 1..256 with every regime:
#              the ratios against copy and bf16 cuBLAS, and the crossover it measures
#   replay     the Kimi-shape EAGLE-3 (synth kimi-k2.5-eagle3, 6.36 GB, written on the device) through
#              bench replay --device cuda over 2048 synthetic positions, the whole step on the
#              device (the trace kept for the gate), then 512 positions with --step per-linear:
#              where pass A goes in each
#   quant      kquant quantize of that draft, int4-pc --exclude fc,lm_head (the README's gate)
#   gate       the paired Kimi-shape gate: verify --draft INT4 --baseline BF16 --device cuda over
#              the kept trace (2 drafts × 2048 positions × 3 depths; goal ≤ 10 s end to end)
#   verify     verify --device cuda against --device cpu-emu on the tiny EAGLE-3 and DFlash drafts
#              (the accept lengths must agree)
set -uo pipefail

cd "$(dirname "$0")/.."
root=$(pwd)
BIN="$root/target/gpu-bin"

# name:seconds:invocations, in order (each invocation under its own limit).
STEPS=(libs:20:1 compile:45:2 tier:70:1 full:110:1 gemm:60:1 replay:90:1 quant:40:1 gate:40:1 verify:15:4)

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

case "${1:-}" in
build)
  export CARGO_PROFILE_RELEASE_DEBUG=false
  cargo build --release --features cuda || exit 1
  tests=$(cargo test --release --features cuda --test kquant --no-run --message-format=json 2>/dev/null \
    | python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "kquant" and m["profile"]["test"]:
        print(m["executable"])' | tail -1)
  [ -n "$tests" ] || { echo "error: no test binary (cargo test --release --features cuda --test kquant --no-run)" >&2; exit 1; }
  rm -rf "$BIN"
  mkdir -p "$BIN"
  cp target/release/kquant "$BIN/kquant"
  cp "$tests" "$BIN/kquant-tests"
  strip "$BIN/kquant" "$BIN/kquant-tests" 2>/dev/null || true
  gzip -9 "$BIN/kquant" "$BIN/kquant-tests" || exit 1
  size=$(du -cb "$BIN"/*.gz | tail -1 | cut -f1)
  echo "target/gpu-bin: $((size >> 20)) MiB gzipped (carried with the working tree: 64 MiB in all)"
  [ "$size" -le $((20 << 20)) ] || { echo "error: too large to carry" >&2; exit 1; }
  exit 0
  ;;
stash)
  stash="$root/../kq-device-stash"
  [ ! -e "$stash" ] || { echo "error: $stash exists: run 'bash scripts/gpu_check.sh unstash' first" >&2; exit 2; }
  mkdir -p "$stash" || exit 1
  # Kept: what the check reads (the tiny EAGLE-3 and DFlash drafts, their target and trace).
  keep='^fixtures/kimi-k2\.5-tiny/(eagle3|dflash|target|trace)/'
  git ls-files -z fixtures | while IFS= read -r -d '' f; do
    if [[ "$f" =~ $keep ]] || [ ! -e "$f" ]; then continue; fi
    # Listed before it moves: a kill in between leaves a listed file still in place, which
    # unstash passes over, never a moved file it does not know.
    printf '%s\0' "$f" >>"$stash/MANIFEST" && mkdir -p "$stash/$(dirname "$f")" && mv "$f" "$stash/$f" || exit 1
  done || exit 1
  tree=$(git ls-files -z | while IFS= read -r -d '' f; do [ -f "$f" ] && printf '%s\0' "$f"; done \
    | du -cb --files0-from=- | tail -1 | cut -f1)
  bins=$(du -cb "$BIN"/*.gz 2>/dev/null | tail -1 | cut -f1)
  echo "moved $(tr -cd '\0' <"$stash/MANIFEST" | wc -c) files to $stash; the call sends $(((tree + ${bins:-0}) >> 20)) MiB (64 at most)"
  echo "after the call: bash scripts/gpu_check.sh unstash (until then git status shows them deleted)"
  exit 0
  ;;
unstash)
  stash="$root/../kq-device-stash"
  [ -f "$stash/MANIFEST" ] || { echo "error: nothing stashed ($stash/MANIFEST missing)" >&2; exit 2; }
  while IFS= read -r -d '' f; do
    if [ ! -e "$stash/$f" ] && [ -e "$f" ]; then continue; fi # listed, never moved
    [ ! -e "$f" ] || { echo "error: $f exists again: not overwriting it (the stash stays in $stash)" >&2; exit 1; }
    mkdir -p "$(dirname "$f")" && mv "$stash/$f" "$f" || exit 1
  done <"$stash/MANIFEST"
  rm -rf "$stash"
  git status --short -- fixtures | head -5
  echo "restored"
  exit 0
  ;;
--dry-run)
  total=0
  for s in "${STEPS[@]}"; do
    IFS=: read -r name secs count <<<"$s"
    echo "$name: $count × at most $secs s"
    total=$((total + secs * count))
  done
  echo "at most $total s in all (the device call allows 600)"
  exit 0
  ;;
run) ;;
*) usage; exit 2 ;;
esac

: "${OUT:?run on the device machine, where \$OUT is set}"
[ -f "$BIN/kquant.gz" ] && [ -f "$BIN/kquant-tests.gz" ] || {
  echo "error: $BIN/kquant.gz and kquant-tests.gz missing: run 'bash scripts/gpu_check.sh build' here and carry target/gpu-bin" >&2
  exit 2
}
# The test binary was compiled in /work/main (env!("CARGO_MANIFEST_DIR") and its
# CARGO_BIN_EXE_kquant): make that path this checkout, with the binary where the tests run it.
if [ "$root" != /work/main ] && [ ! -e /work/main ]; then
  mkdir -p /work && ln -s "$root" /work/main
fi
mkdir -p "$root/target/release"
gzip -dc "$BIN/kquant.gz" >"$root/target/release/kquant" && chmod +x "$root/target/release/kquant"
gzip -dc "$BIN/kquant-tests.gz" >/tmp/kquant-tests && chmod +x /tmp/kquant-tests
K="$root/target/release/kquant"
T=/tmp/kquant-tests
summary="$OUT/summary.txt"
: >"$summary"
limit() {
  for s in "${STEPS[@]}"; do
    IFS=: read -r name secs _ <<<"$s"
    [ "$name" = "$1" ] && echo "$secs"
  done
}
# step NAME LOG CMD...: run under the step's limit, append the command's output to LOG.
step() {
  local name=$1 log=$2
  shift 2
  local t0=$SECONDS
  echo "== $name: $*" >>"$log"
  timeout "$(limit "$name")" "$@" >>"$log" 2>&1
  local rc=$?
  printf '%-8s rc=%-3s %4ss  %s\n' "$name" "$rc" "$((SECONDS - t0))" "$*" | tee -a "$summary"
  return $rc
}

# libs: cudarc loads libnvrtc.so / libcublas.so (and .so.12 …), not CUDA 13's .so.13.
libdir=/tmp/kq-libs
mkdir -p "$libdir"
t0=$SECONDS
dirs=""
for lib in nvrtc cublas cublasLt nvrtc-builtins; do
  f=$(find / -xdev \( -path /proc -o -path /sys \) -prune -o -name "lib$lib.so*" -print 2>/dev/null \
      | grep -E "lib$lib\.so(\.[0-9]+)*$" | sort -V | tail -1)
  [ -n "$f" ] || continue
  ln -sf "$f" "$libdir/lib$lib.so"
  dirs="$dirs:$(dirname "$f")"
done
export LD_LIBRARY_PATH="$libdir$dirs:${LD_LIBRARY_PATH:-}"
printf '%-8s rc=%-3s %4ss  %s\n' libs 0 "$((SECONDS - t0))" "$(ls "$libdir" | tr '\n' ' ')" | tee -a "$summary"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >>"$summary" 2>&1

# compile: a first and a second process on an empty cache.
export KQUANT_KERNEL_CACHE=/tmp/kq-kernel-cache
rm -rf "$KQUANT_KERNEL_CACHE"
for run in first second; do
  step compile "$OUT/bench.log" "$K" bench gemm --device cuda --shapes 7168x4096 --m 1 --iters 5
  grep -h '^kernels ' "$OUT/bench.log" | tail -1 | sed "s/^/         $run: /" | tee -a "$summary"
done

# tier: the ::cuda tests at slice shapes; full: the full shapes (dense lm_head included).
step tier "$OUT/tests.log" "$T" --ignored --test-threads 1 gpu_gemm:: gpu_dense:: gpu_linear::
KQUANT_GPU_FULL_SHAPES=1 step full "$OUT/tests.log" "$T" --ignored --test-threads 1 \
  gpu_dense:: gpu_gemm::dense_matches gpu_gemm::mma_matches gpu_gemm::kept_weights

# gemm: the ratios and the crossover.
step gemm "$OUT/gemm.json" "$K" bench gemm --device cuda --json --m 1,8,16,32,64,129,256 \
  --regime gemv,mma,dense
python3 - "$OUT/gemm.json" <<'PY' | tee -a "$summary"
import json, sys
t = open(sys.argv[1]).read()
doc = json.loads(t[t.index("{"):])
for c in doc.get("crossovers", []):
    print(f"         crossover {c['shape']}: INT4 slower than bf16 from M = {c['int4_slower_than_bf16_from_m']}, regime C from {c['regime_c_from_m']}")
PY

# replay: the Kimi-shape draft's pass A on the device, phase by phase.
step replay "$OUT/replay.log" bash -c "'$K' synth --preset kimi-k2.5-eagle3 -o /tmp/kq-eagle3 --force \
  && '$K' bench replay /tmp/kq-eagle3 --device cuda --synthetic-trace 2304 --prompt-len 256 \
       --write-trace /tmp/kq-trace --force \
  && '$K' bench replay /tmp/kq-eagle3 --device cuda --synthetic-trace 512 --step per-linear"
grep -hE '^(load|pass A)' "$OUT/replay.log" | sed 's/^/         /' | tee -a "$summary"

# quant, gate: the paired gate at Kimi shape, the step's wall in summary.txt.
step quant "$OUT/replay.log" "$K" quantize /tmp/kq-eagle3 -o /tmp/kq-eagle3-int4 --scheme int4-pc \
  --exclude fc,lm_head --force
step gate "$OUT/replay.log" "$K" verify --draft /tmp/kq-eagle3-int4 --baseline /tmp/kq-eagle3 \
  --trace /tmp/kq-trace --device cuda
grep -hE '^(device:|overall|PASSED|FAILED)' "$OUT/replay.log" | tail -4 | sed 's/^/         /' | cut -c1-300 \
  | tee -a "$summary"

# verify: the device's accept lengths against the emulation's, on the fixtures.
for d in eagle3 dflash; do
  for dev in cuda cpu-emu; do
    step verify "$OUT/verify.log" "$K" verify --draft "fixtures/kimi-k2.5-tiny/$d" \
      --target-checkpoint fixtures/kimi-k2.5-tiny/target --trace fixtures/kimi-k2.5-tiny/trace \
      --device "$dev" --json "/tmp/kq-verify-$d-$dev.json"
  done
done
python3 - <<'PY' | tee -a "$summary"
import json, os
for d in ("eagle3", "dflash"):
    al = {}
    for dev in ("cuda", "cpu-emu"):
        p = f"/tmp/kq-verify-{d}-{dev}.json"
        if os.path.exists(p):
            al[dev] = json.load(open(p))["draft"]["accept_length"]
    print(f"         verify {d}: {al}")
PY
echo "done: $summary"
