#!/usr/bin/env bash
# Create (or reuse) the venv of one serving engine for the engine-loader tier, outside the repo:
#   bash tests/engines/venv.sh vllm|sglang     # prints the venv's path
# ${KQUANT_ENGINE_CACHE:-$HOME/.cache/kquant/engines}/ENGINE-VERSION-<hash of the constraints>.
# Exact pin plus the committed `pip freeze` of a working install (constraints-ENGINE-VERSION.txt),
# so that no new release of torch, transformers or anything else changes a verdict. Reused while
# the constraints file is unchanged (a `.complete` marker is written last). About 9–11 GB and
# 3–5 minutes on the first install (PyPI only).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
case "${1:-}" in
  vllm) spec="vllm==0.33.0"; cons="$here/constraints-vllm-0.33.0.txt" ;;
  sglang) spec="sglang==0.5.23"; cons="$here/constraints-sglang-0.5.23.txt" ;;
  *) echo "usage: venv.sh vllm|sglang" >&2; exit 2 ;;
esac
hash=$(sha256sum "$cons" | cut -c1-12)
venv="${KQUANT_ENGINE_CACHE:-$HOME/.cache/kquant/engines}/${spec/==/-}-$hash"
if [ ! -x "$venv/bin/python" ] || [ ! -f "$venv/.complete" ]; then
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  python3 -m venv "$venv" >&2
  nice -n 10 "$venv/bin/pip" install --quiet --upgrade pip >&2
  nice -n 10 "$venv/bin/pip" install --quiet "$spec" -c "$cons" >&2
  touch "$venv/.complete"
fi
echo "$venv"
