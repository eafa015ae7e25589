#!/usr/bin/env bash
# End-to-end check of the real `assistant chat` in a real terminal (tmux):
# start it on a fresh profile, ask "What is the capital of France?", read the
# screen until the answer shows "Paris", quit with Ctrl+Q and expect exit code 0
# with the exchange saved. Usage: tmux_e2e.sh [path/to/assistant]   (exit 0 = pass)
set -euo pipefail

BIN=${1:-assistant}
BIN=$(command -v "$BIN")
WORK=$(mktemp -d)
SOCK="assistant-e2e-$$"
T="tmux -L $SOCK"
SCREEN="$WORK/screen.txt"

cleanup() {
    $T kill-server 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

# A fresh profile: fp32 (exact greedy output on CPU), short answers, a budget for the status line.
mkdir -p "$WORK/home/profiles/default"
cat > "$WORK/home/profiles/default/profile.toml" <<'TOML'
target = "default"
dtype = "fp32"
memory_budget = "4GiB"
max_new_tokens = 32
TOML

capture() { $T capture-pane -p -t e2e > "$SCREEN" 2>/dev/null || true; }

wait_for() {   # wait_for PATTERN SECONDS
    local deadline=$((SECONDS + $2))
    while (( SECONDS < deadline )); do
        capture
        if grep -q -- "$1" "$SCREEN"; then return 0; fi
        sleep 0.5
    done
    echo "tmux_e2e: timed out after $2 s waiting for: $1" >&2
    echo "----- screen -----" >&2
    cat "$SCREEN" >&2
    return 1
}

# A private tmux server (-L) so the environment below is the one the program gets.
$T new-session -d -s e2e -x 120 -y 36 \
    "env ASSISTANT_HOME='$WORK/home' TERM=xterm-256color '$BIN' chat; echo \"__EXIT__ \$?\"; sleep 120"

wait_for "Ask anything" 60                       # the UI is up (the model still loads in the background)
$T send-keys -t e2e -l "What is the capital of France?"
$T send-keys -t e2e Enter
wait_for "Paris" 240                             # streamed answer on screen
wait_for "tok/pass" 30                           # the status line shows the decoding numbers
sleep 2                                          # let the answer finish and be saved
$T send-keys -t e2e C-q
wait_for "__EXIT__" 30
grep -q "__EXIT__ 0" "$SCREEN" || { echo "tmux_e2e: non-zero exit" >&2; cat "$SCREEN" >&2; exit 1; }
if grep -q "Traceback" "$SCREEN"; then echo "tmux_e2e: traceback on screen" >&2; cat "$SCREEN" >&2; exit 1; fi

# losing nothing: the exchange is in the profile's history
ASSISTANT_HOME="$WORK/home" "$BIN" profile show --json > "$WORK/show.json"
grep -q '"messages": *2' "$WORK/show.json" || { echo "tmux_e2e: history not saved" >&2; cat "$WORK/show.json" >&2; exit 1; }
echo "tmux_e2e: ok"
