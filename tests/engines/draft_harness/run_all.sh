#!/bin/bash
# The results.md matrix: random-weight checkpoints (or the trained fixtures with --trained),
# vLLM's drafting over the whole trace (run.py), drafts2026 held to it (compare.py).
#   bash tests/engines/draft_harness/run_all.sh [--trained] [OUT_DIR]   (about 10 min on one core)
set -u
cd "$(dirname "$0")/../../.."
VPY=${VPY:-$HOME/.cache/kquant/engines/vllm-0.33.0-be82faf4c641/bin/python}
FPY=${FPY:-$HOME/.cache/kquant/venv-12142216c9b8/bin/python}
TRAINED=0
if [ "${1:-}" = "--trained" ]; then TRAINED=1; shift; fi
OUT=${1:-/tmp/draft-harness}
mkdir -p "$OUT"
if [ $TRAINED = 1 ]; then
  DRAFTS="fixtures/kimi-k2.5-tiny/dspark fixtures/kimi-k2.5-tiny/dflash2"
else
  $FPY tests/engines/draft_harness/make_ckpt.py "$OUT/ckpt" >/dev/null
  DRAFTS="$OUT/ckpt/dspark-warm $OUT/ckpt/dspark-1n-warm $OUT/ckpt/dflash2-warm $OUT/ckpt/dspark-random $OUT/ckpt/dflash2-random"
fi
fail=0
one() {  # name draft args...
  local n=$1 d=$2; shift 2
  $VPY tests/engines/draft_harness/run.py --draft "$d" --out "$OUT/$n.json" "$@" >"$OUT/$n.log" 2>&1 || { echo "$n: run.py failed (see $OUT/$n.log)"; fail=1; return; }
  if ! $FPY tests/engines/draft_harness/compare.py "$OUT/$n.json" --json "$OUT/$n.cmp.json" 2>"$OUT/$n.cmp.log"; then
    case "$n" in *bfloat16) ;; *) fail=1 ;; esac
  fi
}
for d in $DRAFTS; do
  b=$(basename "$d")
  one "$b-float32" "$d" --dtype float32
  one "$b-bfloat16" "$d" --dtype bfloat16
  case "$b" in dspark*) one "$b-topk8" "$d" --dtype float32 --topk 8 ;; esac
done
echo "float32 rows must agree exactly; bfloat16 rows differ by rounding (README)."
exit $fail
