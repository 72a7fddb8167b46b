#!/bin/bash
# The CI slice of the draft harness (.ci/run): vLLM 0.33.0's own DSpark and DFlash2 drafting on
# CPU (run.py) over the first 6 samples of the tiny trace, with the trained fixtures and the random
# MLA DSpark (k3-dspark, vLLM K3DSparkForCausalLM), at float32,
# and fixtures/gen/verify/drafts2026.py (the reference tests/parity_blocks2026.rs holds kquant's
# replay to) compared root by root (compare.py): exit 1 on any differing proposal, confidence or
# walk. About 20 s a row on 2 cores. The whole matrix: run_all.sh.
set -euo pipefail
cd "$(dirname "$0")/../../.."
VPY=${VPY:-$(bash tests/engines/venv.sh vllm)/bin/python}
FPY=${FPY:-$(bash fixtures/gen/venv.sh)/bin/python}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
row() {  # name draft args...
  local n=$1 d=$2; shift 2
  if ! "$VPY" tests/engines/draft_harness/run.py --draft "$d" --limit 6 --dtype float32 --out "$out/$n.json" "$@" >"$out/$n.log" 2>&1; then
    tail -n 30 "$out/$n.log" >&2
    echo "error: draft harness: run.py failed for $n" >&2
    exit 1
  fi
  if ! "$FPY" tests/engines/draft_harness/compare.py "$out/$n.json" >"$out/$n.cmp" 2>&1; then
    cat "$out/$n.cmp" >&2
    echo "error: draft harness: drafts2026.py differs from vLLM's drafting for $n (above)" >&2
    exit 1
  fi
  tail -n 1 "$out/$n.cmp"
}
row dspark fixtures/kimi-k2.5-tiny/dspark
row dspark-topk8 fixtures/kimi-k2.5-tiny/dspark --topk 8
row dflash2 fixtures/kimi-k2.5-tiny/dflash2
row k3-dspark fixtures/kimi-k2.5-tiny/k3-dspark
