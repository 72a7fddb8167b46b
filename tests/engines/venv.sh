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
source "$here/../../fixtures/gen/pinned_venv.sh"
case "${1:-}" in
  vllm) spec="vllm==0.33.0"; cons="$here/constraints-vllm-0.33.0.txt" ;;
  sglang) spec="sglang==0.5.23"; cons="$here/constraints-sglang-0.5.23.txt" ;;
  *) echo "usage: venv.sh vllm|sglang" >&2; exit 2 ;;
esac
hash=$(sha256sum "$cons" | cut -c1-12)
install_pinned() { nice -n 10 "$1/bin/pip" install --quiet "$spec" -c "$cons"; }
pinned_venv "${KQUANT_ENGINE_CACHE:-$HOME/.cache/kquant/engines}/${spec/==/-}-$hash" nice -n 10
