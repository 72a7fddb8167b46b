#!/usr/bin/env bash
# The engine-loader tier (docs/engines.md): builds (or reuses) both engines' venvs, then runs
# every tiny draft, convert output and quantize output through vLLM's and SGLang's own loaders
# and compares each verdict with kquant's claim.
#   bash tests/engines/run.sh [--doc docs/engines.md] [--json FILE]
# KQUANT_BIN: the kquant binary to test (default: `cargo build --release`, then target/release).
# KQUANT_ENGINE_WORK: where the checkpoints are written (default: a new temp dir, removed after).
set -euo pipefail
cd "$(dirname "$0")/../.."
kquant="${KQUANT_BIN:-}"
if [ -z "$kquant" ]; then
  cargo build --release --locked --quiet
  kquant=target/release/kquant
fi
# Both venvs at once when missing (the installs are mostly download and unpacking).
log="$(mktemp -d)"
bash tests/engines/venv.sh vllm >"$log/vllm" 2>"$log/vllm.err" &
pv=$!
bash tests/engines/venv.sh sglang >"$log/sglang" 2>"$log/sglang.err" &
ps=$!
wait $pv || { cat "$log/vllm.err" >&2; echo "error: the vLLM venv could not be built" >&2; exit 2; }
wait $ps || { cat "$log/sglang.err" >&2; echo "error: the SGLang venv could not be built" >&2; exit 2; }
work="${KQUANT_ENGINE_WORK:-}"
if [ -z "$work" ]; then
  work="$(mktemp -d "${TMPDIR:-/tmp}/kquant-engine-tier.XXXXXX")"
  trap 'rm -rf "$work" "$log"' EXIT
fi
python3 tests/engines/matrix.py --kquant "$kquant" --vllm "$(cat "$log/vllm")" \
  --sglang "$(cat "$log/sglang")" --work "$work" "$@"
# SGLang's context rule against the launch line `convert --to sglang` prints.
"$(cat "$log/sglang")/bin/python" tests/engines/sglang_context.py --kquant "$kquant" --work "$work"
