#!/usr/bin/env bash
# `make demo`: the whole system on one machine in about a minute.
#
#   1. starts the local Kafka broker (scripts/kafka.sh) unless one is running on $KAFKA_PORT;
#   2. runs the worker (`iolstream run -c config/worker.yaml`) in the background, on topics,
#      a consumer group and a snapshot dir of its own (IOLSTREAM_* overrides, see config.py);
#   3. replays the `segment` stream (or $DATASET) with `iolstream produce` (shuffled, labels 50 rows late, a few
#      out of order, duplicated or never sent), creating the topics, and follows the predictions:
#      live rows and prequential accuracy of -F;
#   4. writes the learning curve of the worker's predictions (joined with the true labels);
#   5. stops the worker with SIGTERM (it must exit 0), deletes the demo topics, and stops the
#      broker only if it started it.
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
OUT="${DEMO_DIR:-.iolstream/demo}"
PLOT="${DEMO_PLOT:-demo-learning-curve.png}"
IOLSTREAM="${IOLSTREAM:-.venv/bin/iolstream}"
PYTHON="$(dirname "$IOLSTREAM")/python"
RUN="demo-$(date +%Y%m%d-%H%M%S)-$$"

[ -x "$IOLSTREAM" ] || { echo "demo: $IOLSTREAM not found; run 'make install' first" >&2; exit 1; }
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
from iolstream.tools.datasets import load
d = load('$DATASET', rows=10)
print(d.X.shape[1], list(d.classes) if d.task == 'classification' else 'none')")
        export IOLSTREAM_MODEL__N_INPUTS="$K" IOLSTREAM_MODEL__FORGETTING=auto IOLSTREAM_MODEL__LAM=auto
        if [ "$CLASSES" = none ]; then export IOLSTREAM_MODEL__CLASSES=null IOLSTREAM_MODEL__N_OUTPUTS=1
        else export IOLSTREAM_MODEL__CLASSES="$CLASSES"; fi
        ORDER=(--rows 20000)
        RATE="${DEMO_RATE:-1000}"
        ;;
    *) echo "demo: DATASET=$DATASET: use segment, hyperplane, sea, agrawal, rbf-drift or friedman-drift" >&2; exit 2 ;;
esac
export IOLSTREAM_LOGGING__STATUS_EVERY_SECONDS=5

say() { printf '\n== %s\n' "$*"; }

STARTED_BROKER=0
WORKER_PID=""
cleanup() {
    local status=$?
    if [ -n "$WORKER_PID" ] && kill -0 "$WORKER_PID" 2>/dev/null; then
        kill -TERM "$WORKER_PID" 2>/dev/null || true
        wait "$WORKER_PID" 2>/dev/null || true
    fi
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

say "worker: $IOLSTREAM run -c config/worker.yaml   (topics $RUN.*, log $OUT/worker.log)"
"$IOLSTREAM" run -c config/worker.yaml >"$OUT/worker.log" 2>&1 &
WORKER_PID=$!
echo "pid $WORKER_PID"

say "producer: $DATASET at $RATE rows/s; labels 50 rows late, shuffled within 20 rows, 3 % sent twice, 2 % never"
"$IOLSTREAM" produce -c config/worker.yaml --create-topics --dataset "$DATASET" "${ORDER[@]}" --seed 0 --rate "$RATE" \
    --label-delay-rows 50 --shuffle-window 20 --duplicate-fraction 0.03 --missing-fraction 0.02 \
    --follow --plot "$PLOT"

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
