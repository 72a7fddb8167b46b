#!/usr/bin/env bash
# Long kill soak of the write path: the random-kill test of tests/hardening.rs with N rounds
# (4 kills of each writing command per round: new and replacing outputs, SIGKILL and SIGTERM).
#   bash fuzz/kill-soak.sh [N]    # default 100 (about 25 minutes on 2 cores)
# Every kill must leave nothing or a whole output under the final name, and the next run must
# succeed and leave nothing else behind. Also runs the racing-writers test N/10 times.
set -euo pipefail
cd "$(dirname "$0")/.."
n="${1:-100}"
start=$(date +%s)
KQUANT_KILL_ROUNDS="$n" cargo test --test kquant -- --exact \
    hardening::kills_at_random_moments_of_every_writing_command
for _ in $(seq 1 $(( (n + 9) / 10 ))); do
    cargo test --test kquant -- --exact hardening::racing_writers_never_both_win -q
done
echo "kill soak: $n rounds in $(( $(date +%s) - start )) s"
