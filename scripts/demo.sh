#!/usr/bin/env bash
# `make demo`: the whole system on one machine in about a minute.
#
#   1. starts the local Kafka broker (scripts/kafka.sh) unless one is running on $KAFKA_PORT;
#   2. runs the worker (`iolstream run -c config/worker.yaml`) in the background, on topics,
#      a consumer group and a snapshot dir of its own (IOLSTREAM_* overrides, see config.py);
#   3. once the worker has its compiled kernels (a fresh clone's first start compiles them: about a minute),
#      replays the `segment` stream (or $DATASET) with `iolstream produce` (shuffled, labels 50 rows late, a few
#      out of order, duplicated or never sent), creating the topics, and follows the predictions:
#      live rows and prequential accuracy of -F;
#   4. writes the learning curve of the worker's predictions (joined with the true labels);
#   5. stops the worker with SIGTERM (it must exit 0), deletes the demo topics, and stops the
#      broker only if it started it.
#
# WORKERS=N (default 1) runs N workers in one consumer group with group learning (docs/scaling.md): topics
# of DEMO_PARTITIONS partitions (default 4), member ids demo-1 ... demo-N (IOLSTREAM_GROUP__MEMBER_ID), one
# log each ($DEMO_DIR/worker-<i>.log) and a metrics port each (free ports, printed); once the replay is
# over it shows every member's status line and group metrics (group size, predictions), then stops them
# all (each must exit 0). A drifting DATASET forgets on the group's clock (rows seen by all members);
# friedman-drift runs with model.target_scaler none (the members must share one target scaling).
#
# Environment: KAFKA_PORT (default 19092), DEMO_RATE rows/s (default 100), DEMO_PLOT (default
# demo-learning-curve.png), DEMO_DIR for the worker's log and snapshots (default .iolstream/demo),
# KEEP_TOPICS=1 to keep the demo topics, IOLSTREAM (the CLI, default .venv/bin/iolstream),
# DATASET (default segment): a drifting stream (hyperplane, sea, agrawal, rbf-drift, friedman-drift) is
# replayed in its own order, 20,000 rows, and the worker runs with model.lam and model.forgetting auto.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
PORT="${KAFKA_PORT:-19092}"
RATE="${DEMO_RATE:-100}"
DATASET="${DATASET:-segment}"
WORKERS="${WORKERS:-1}"
PARTITIONS="${DEMO_PARTITIONS:-4}"
OUT="${DEMO_DIR:-.iolstream/demo}"
PLOT="${DEMO_PLOT:-demo-learning-curve.png}"
IOLSTREAM="${IOLSTREAM:-.venv/bin/iolstream}"
PYTHON="$(dirname "$IOLSTREAM")/python"
RUN="demo-$(date +%Y%m%d-%H%M%S)-$$"

[ -x "$IOLSTREAM" ] || { echo "demo: $IOLSTREAM not found; run 'make install' first" >&2; exit 1; }
[[ "$WORKERS" =~ ^[1-9][0-9]?$ ]] || { echo "demo: WORKERS=$WORKERS: expected a number of workers from 1 to 99" >&2; exit 2; }
[[ "$PARTITIONS" =~ ^[1-9][0-9]*$ ]] || { echo "demo: DEMO_PARTITIONS=$PARTITIONS: expected a positive integer" >&2; exit 2; }
mkdir -p "$OUT"
rm -rf "$OUT/snapshots"

export KAFKA_PORT="$PORT"
export IOLSTREAM_KAFKA__BOOTSTRAP_SERVERS="127.0.0.1:$PORT"
export IOLSTREAM_KAFKA__GROUP_ID="$RUN"
export IOLSTREAM_TOPICS__FEATURES="$RUN.features"
export IOLSTREAM_TOPICS__LABELS="$RUN.labels"
export IOLSTREAM_TOPICS__PREDICTIONS="$RUN.predictions"
export IOLSTREAM_TOPICS__DEAD_LETTERS="$RUN.dead-letters"
export IOLSTREAM_SNAPSHOT__DIR="$OUT/snapshots"
export IOLSTREAM_METRICS__PORT=0
ORDER=(--shuffle)
case "$DATASET" in
    segment) ;;
    hyperplane|sea|agrawal|rbf-drift|friedman-drift)
        # the model's shape from the stream's; forgetting and λ chosen online
        read -r K CLASSES < <("$PYTHON" -c "
from iolstream.tools.builtin_datasets import load
d = load('$DATASET', rows=10)
print(d.X.shape[1], list(d.classes) if d.task == 'classification' else 'none')")
        export IOLSTREAM_MODEL__N_INPUTS="$K" IOLSTREAM_MODEL__FORGETTING=auto IOLSTREAM_MODEL__LAM=auto
        if [ "$CLASSES" = none ]; then export IOLSTREAM_MODEL__CLASSES=null IOLSTREAM_MODEL__N_OUTPUTS=1
        else export IOLSTREAM_MODEL__CLASSES="$CLASSES"; fi
        ORDER=(--rows 20000)
        RATE="${DEMO_RATE:-1000}"
        if [ "$WORKERS" -gt 1 ] && [ "$CLASSES" = none ]; then  # one target scaling for the group (config.py)
            export IOLSTREAM_MODEL__TARGET_SCALER=none
        fi
        ;;
    *) echo "demo: DATASET=$DATASET: use segment, hyperplane, sea, agrawal, rbf-drift or friedman-drift" >&2; exit 2 ;;
esac
export IOLSTREAM_LOGGING__STATUS_EVERY_SECONDS=5
if [ "$WORKERS" -gt 1 ]; then  # one model over the consumer group: rows and labels keyed by id (produce does)
    export IOLSTREAM_GROUP__ENABLED=true IOLSTREAM_TOPICS__PARTITIONS="$PARTITIONS"
    export IOLSTREAM_TOPICS__MODEL_DELTAS="$RUN.model-deltas"
    read -r -a PORTS < <("$PYTHON" -c "
import socket
socks = [socket.socket() for _ in range($WORKERS)]
for s in socks:
    s.bind(('127.0.0.1', 0))
print(*[s.getsockname()[1] for s in socks])")
fi

say() { printf '\n== %s\n' "$*"; }

STARTED_BROKER=0
WORKER_PID=""
WORKER_PIDS=()
cleanup() {
    local status=$?
    local pid
    for pid in $WORKER_PID "${WORKER_PIDS[@]}"; do
        if kill -0 "$pid" 2>/dev/null; then
            kill -TERM "$pid" 2>/dev/null || true
            wait "$pid" 2>/dev/null || true
        fi
    done
    if [ "${KEEP_TOPICS:-0}" != 1 ] && bash scripts/kafka.sh status >/dev/null 2>&1; then
        "$PYTHON" - "$RUN" "127.0.0.1:$PORT" <<'EOF' || true
import sys
from confluent_kafka.admin import AdminClient
run, bootstrap = sys.argv[1:]
admin = AdminClient({"bootstrap.servers": bootstrap})
names = [t for t in admin.list_topics(timeout=10).topics if t.startswith(run + ".")]
for fut in (admin.delete_topics(names, operation_timeout=10).values() if names else []):
    try:
        fut.result(10)
    except Exception:
        pass
EOF
    fi
    if [ "$STARTED_BROKER" = 1 ]; then
        say "stopping the broker this demo started"
        bash scripts/kafka.sh stop || true
    fi
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say "Kafka broker on 127.0.0.1:$PORT"
if bash scripts/kafka.sh status >/dev/null 2>&1; then
    echo "already running: using it (and leaving it running)"
else
    bash scripts/kafka.sh start
    STARTED_BROKER=1
fi

if [ "$WORKERS" = 1 ]; then
    say "worker: $IOLSTREAM run -c config/worker.yaml   (topics $RUN.*, log $OUT/worker.log)"
    "$IOLSTREAM" run -c config/worker.yaml >"$OUT/worker.log" 2>&1 &
    WORKER_PID=$!
    echo "pid $WORKER_PID"
else
    say "$WORKERS workers, one model (group learning): $IOLSTREAM run -c config/worker.yaml   ($PARTITIONS partitions)"
    for i in $(seq 1 "$WORKERS"); do
        IOLSTREAM_GROUP__MEMBER_ID="demo-$i" IOLSTREAM_METRICS__PORT="${PORTS[$((i - 1))]}" IOLSTREAM_METRICS__HOST=127.0.0.1 \
            "$IOLSTREAM" run -c config/worker.yaml >"$OUT/worker-$i.log" 2>&1 &
        WORKER_PIDS+=($!)
        echo "member demo-$i: pid $!, metrics http://127.0.0.1:${PORTS[$((i - 1))]}/metrics, log $OUT/worker-$i.log"
    done
fi

# The first start of a fresh clone compiles the worker's kernels (about a minute, longer on a busy machine): the
# replay starts once every worker has them, so that --follow waits for predictions, not for a compiler.
wait_for_kernels() {  # log pid: until the worker's log says its kernels are loaded or compiled
    local waited=0
    until grep -qE "kernels (loaded|compiled)" "$1" 2>/dev/null; do
        if ! kill -0 "$2" 2>/dev/null; then
            echo "demo: the worker (pid $2) stopped before it was ready: $1" >&2
            tail -n 20 "$1" >&2
            exit 1
        fi
        if [ "$waited" = 5 ]; then echo "waiting for the worker's kernels (a first start compiles them: about a minute)"; fi
        if [ "$waited" -ge 900 ]; then echo "demo: the worker was not ready after 900 s: $1" >&2; exit 1; fi
        sleep 1
        waited=$((waited + 1))
    done
}
if [ "$WORKERS" = 1 ]; then
    wait_for_kernels "$OUT/worker.log" "$WORKER_PID"
else
    for i in $(seq 1 "$WORKERS"); do wait_for_kernels "$OUT/worker-$i.log" "${WORKER_PIDS[$((i - 1))]}"; done
fi

say "producer: $DATASET at $RATE rows/s; labels 50 rows late, shuffled within 20 rows, 3 % sent twice, 2 % never"
"$IOLSTREAM" produce -c config/worker.yaml --create-topics --dataset "$DATASET" "${ORDER[@]}" --seed 0 --rate "$RATE" \
    --label-delay-rows 50 --shuffle-window 20 --duplicate-fraction 0.03 --missing-fraction 0.02 \
    --follow --plot "$PLOT"

if [ "$WORKERS" -gt 1 ]; then
    sleep "$IOLSTREAM_LOGGING__STATUS_EVERY_SECONDS"  # a status line after the last rows, the others' sums applied
    say "the group: each member's last status line and metrics"
    for i in $(seq 1 "$WORKERS"); do
        grep -E "rows_in=" "$OUT/worker-$i.log" | tail -n 1 | sed "s/^/demo-$i: /"
        "$PYTHON" - "${PORTS[$((i - 1))]}" "demo-$i" <<'EOF' || true
import sys
import urllib.request
from prometheus_client.parser import text_string_to_metric_families
port, member = sys.argv[1:]
text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
wanted = ("iolstream_predictions_total", "iolstream_rows_learned_total", "iolstream_model_version")
for fam in text_string_to_metric_families(text):
    for s in fam.samples:
        if s.name in wanted or s.name.startswith("iolstream_group_"):
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            print(f"{member}:   {s.name}{'{' + labels + '}' if labels else ''} {s.value:g}")
EOF
    done
    say "stopping the $WORKERS workers (SIGTERM)"
    kill -TERM "${WORKER_PIDS[@]}"
    failed=0
    for i in $(seq 1 "$WORKERS"); do
        set +e
        wait "${WORKER_PIDS[$((i - 1))]}"
        code=$?
        set -e
        grep -E "rows_in=" "$OUT/worker-$i.log" | tail -n 1 | sed "s/^/demo-$i: /"
        if [ "$code" != 0 ]; then
            echo "demo: member demo-$i exited with $code (log: $OUT/worker-$i.log)" >&2
            failed=1
        else
            echo "demo-$i exited 0; final snapshot in $OUT/snapshots/demo-$i"
        fi
    done
    WORKER_PIDS=()
    [ "$failed" = 0 ] || exit 1
    say "done: learning curve in $PLOT"
    exit 0
fi

say "stopping the worker (SIGTERM)"
kill -TERM "$WORKER_PID"
set +e
wait "$WORKER_PID"
code=$?
set -e
WORKER_PID=""
grep -E "rows_in=" "$OUT/worker.log" | tail -n 1 | sed 's/^/worker: /'
if [ "$code" != 0 ]; then
    echo "demo: the worker exited with $code (log: $OUT/worker.log)" >&2
    exit 1
fi
echo "worker exited 0; final snapshot in $OUT/snapshots"

say "done: learning curve in $PLOT"
