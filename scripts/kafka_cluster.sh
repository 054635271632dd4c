#!/usr/bin/env bash
# A local three-node Apache Kafka cluster (KRaft; every node a broker and a controller, one JVM each), for the
# tests that kill a partition leader (tests/cluster/) and for trying the worker against replication. Each node
# is a scripts/kafka.sh broker with its own state dir; they share one cluster id and the controller quorum.
#
#   bash scripts/kafka_cluster.sh start|stop|status|wipe|bootstrap
#   bash scripts/kafka_cluster.sh kill N         SIGKILL node N (1..3), as a crash would
#   bash scripts/kafka_cluster.sh start-node N   start node N again (after kill)
#   bash scripts/kafka_cluster.sh pid N          the pid of node N
#
# Environment:
#   KAFKA_CLUSTER_PORT          client port of node 1 (default 19292); node N listens on PORT+2(N-1), its
#                               controller on the next port: 19292/19293, 19294/19295, 19296/19297
#   KAFKA_CLUSTER_NODES         number of nodes (default 3)
#   IOLSTREAM_KAFKA_CLUSTER_DATA  state dir (default <repo>/.kafka/cluster-<port>): node-N/ per node, cluster.id
#   KAFKA_HEAP_OPTS             per node (default "-Xms128m -Xmx256m": three nodes use about 0.9 GB)
#   KAFKA_SESSION_TIMEOUT_MS    broker.session.timeout.ms (default 3000): how soon the controller fences a
#                               node that stopped answering and moves its partitions' leadership
#   KAFKA_EXTRA_PROPERTIES, KAFKA_START_TIMEOUT, IOLSTREAM_KAFKA_CACHE, JAVA_HOME, MVN: as for kafka.sh
#
# Topics get replication factor = the number of nodes and min.insync.replicas = one less (3 and 2).
# Exit codes: 0 ok (status: all running), 3 status: some node stopped, 1 failure, 2 usage.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$SCRIPT_DIR/.." && pwd)"
KAFKA_SH="$SCRIPT_DIR/kafka.sh"
BASE="${KAFKA_CLUSTER_PORT:-19292}"
NODES="${KAFKA_CLUSTER_NODES:-3}"
STATE="${IOLSTREAM_KAFKA_CLUSTER_DATA:-$REPO/.kafka/cluster-$BASE}"
HEAP="${KAFKA_HEAP_OPTS:--Xms128m -Xmx256m}"
SESSION_MS="${KAFKA_SESSION_TIMEOUT_MS:-3000}"
START_TIMEOUT="${KAFKA_START_TIMEOUT:-120}"

log() { echo "kafka_cluster.sh[$BASE]: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
[[ "$NODES" =~ ^[1-9]$ ]] || { echo "kafka_cluster.sh: KAFKA_CLUSTER_NODES must be 1..9, not '$NODES'" >&2; exit 2; }

port_of() { echo $((BASE + 2 * ($1 - 1))); }
bootstrap() {
    local n out=""
    for n in $(seq 1 "$NODES"); do out="$out${out:+,}127.0.0.1:$(port_of "$n")"; done
    echo "$out"
}
voters() {
    local n out=""
    for n in $(seq 1 "$NODES"); do out="$out${out:+,}$n@127.0.0.1:$(($(port_of "$n") + 1))"; done
    echo "$out"
}
check_node() { [[ "$1" =~ ^[0-9]+$ ]] && [ "$1" -ge 1 ] && [ "$1" -le "$NODES" ] || { echo "kafka_cluster.sh: no node '$1' (1..$NODES)" >&2; exit 2; }; }

# kafka.sh for node N: its ports, its state dir, the shared quorum and cluster id
node_sh() {
    local n="$1"; shift
    KAFKA_PORT="$(port_of "$n")" KAFKA_NODE_ID="$n" KAFKA_QUORUM_VOTERS="$(voters)" \
        KAFKA_CLUSTER_ID="$(cat "$STATE/cluster.id")" KAFKA_REPLICATION="$NODES" \
        IOLSTREAM_KAFKA_DATA="$STATE/node-$n" KAFKA_HEAP_OPTS="$HEAP" KAFKA_WAIT_READY=0 KAFKA_SECURITY=plaintext \
        KAFKA_EXTRA_PROPERTIES="broker.session.timeout.ms=$SESSION_MS
broker.heartbeat.interval.ms=$((SESSION_MS / 6 > 100 ? SESSION_MS / 6 : 100))
${KAFKA_EXTRA_PROPERTIES:-}" \
        bash "$KAFKA_SH" "$@"
}

# Wait until a metadata request lists every node (each has registered with the elected controller).
wait_all() {
    local py
    if [ -x "$REPO/.venv/bin/python" ]; then py="$REPO/.venv/bin/python"; else py=python3; fi
    "$py" - "$(bootstrap)" "$NODES" "$START_TIMEOUT" 2>/dev/null <<'PY' || die "not all $NODES nodes answer within ${START_TIMEOUT}s (logs: $STATE/node-*/kafka.log)"
import sys, time
from confluent_kafka.admin import AdminClient

bootstrap, nodes, budget = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
admin = AdminClient({"bootstrap.servers": bootstrap, "socket.connection.setup.timeout.ms": 3000})
deadline = time.time() + budget
while True:
    try:
        if len(admin.list_topics(timeout=3).brokers) >= nodes:
            sys.exit(0)
    except Exception:
        pass
    if time.time() > deadline:
        sys.exit(1)
    time.sleep(0.3)
PY
}

do_start() {
    local t0=$SECONDS n
    mkdir -p "$STATE"
    [ -s "$STATE/cluster.id" ] || head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n' >"$STATE/cluster.id"
    for n in $(seq 1 "$NODES"); do node_sh "$n" start; done
    wait_all
    log "$NODES nodes ready on $(bootstrap) after $((SECONDS - t0)) s"
}

cmd="${1:-}"
case "$cmd" in
    start) do_start ;;
    stop) for n in $(seq "$NODES" -1 1); do [ -s "$STATE/cluster.id" ] && node_sh "$n" stop; done ;;
    wipe)
        if [ -s "$STATE/cluster.id" ]; then for n in $(seq 1 "$NODES"); do node_sh "$n" wipe; done; fi
        case "$STATE" in ""|"/"|"$HOME"|"$REPO") die "refusing to wipe '$STATE'";; esac
        rm -rf "$STATE" "$STATE"/node-*.lock
        rm -f "$STATE".lock
        log "wiped $STATE" ;;
    status)
        rc=0
        for n in $(seq 1 "$NODES"); do
            if [ -s "$STATE/cluster.id" ] && node_sh "$n" status >/dev/null; then echo "node $n: running on 127.0.0.1:$(port_of "$n")"
            else echo "node $n: stopped"; rc=3; fi
        done
        exit "$rc" ;;
    bootstrap) bootstrap ;;
    pid)
        check_node "${2:-}"
        cat "$STATE/node-$2/kafka.pid" ;;
    kill)
        check_node "${2:-}"
        pid="$(cat "$STATE/node-$2/kafka.pid" 2>/dev/null)" || die "node $2 is not running"
        kill -KILL "$pid"
        log "node $2 (pid $pid) killed" ;;
    start-node)
        check_node "${2:-}"
        node_sh "$2" start ;;
    *) echo "usage: $0 start|stop|status|wipe|bootstrap|kill N|start-node N|pid N" >&2; exit 2 ;;
esac
