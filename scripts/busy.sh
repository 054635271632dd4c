#!/usr/bin/env bash
# Run a command with busy processes beside it, as on a machine that is doing something else: `make test-busy`.
#
#   bash scripts/busy.sh COMMAND [ARGS...]
#
# Starts BUSY_PROCESSES (default 2) CPU-bound loops at nice BUSY_NICE (default 19: low priority, as a background
# job; 0 competes with the command as an equal), runs COMMAND, and stops the loops however it ends: its exit or
# failure, Ctrl-C, a TERM (passed on to COMMAND); a loop also ends by itself once this script is gone. Exits with
# COMMAND's status and says how long it took.
#
# The loops run in COMMAND's own session. Where the kernel groups processes by session for scheduling (Linux
# autogroup: /proc/sys/kernel/sched_autogroup_enabled is 1 on most desktops and many servers), a nice value
# counts only inside its session: a job started from another terminal competes with the suite as an equal
# whatever its nice, which is BUSY_NICE=0 here.
set -u

count=${BUSY_PROCESSES:-2}
level=${BUSY_NICE:-19}
python=$(command -v python3 || command -v python)
pids=()
child=

stop_busy() {
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null
    done
    for pid in "${pids[@]}"; do
        wait "$pid" 2>/dev/null
    done
    pids=()
}
trap stop_busy EXIT
# Ctrl-C reaches COMMAND from the terminal (one process group); a TERM sent to this script is passed on
trap ':' INT
trap '[ -n "$child" ] && kill -TERM "$child" 2>/dev/null' TERM

if [ "$#" -eq 0 ]; then
    echo "usage: bash scripts/busy.sh COMMAND [ARGS...]" >&2
    exit 2
fi
# a CPU-bound loop that also ends once this script is gone (its parent changes), however the script ended
loop='import os
parent = os.getppid()
while os.getppid() == parent:
    for _ in range(1_000_000):
        pass'
for _ in $(seq "$count"); do
    nice -n "$level" "$python" -c "$loop" &
    pids+=("$!")
done
echo "busy.sh: $count busy processes at nice $level (pids ${pids[*]}) beside: $*"
started=$(date +%s)
# in the background so that a trap runs while it works; with Ctrl-C's default action restored, which a
# background command of a script would otherwise ignore
( trap - INT QUIT; exec "$@" ) &
child=$!
while :; do
    wait "$child"
    status=$?
    kill -0 "$child" 2>/dev/null || break # wait was cut short by a signal: COMMAND still runs
done
echo "busy.sh: '$*' exited $status after $(($(date +%s) - started)) s with $count busy processes at nice $level"
exit "$status"
