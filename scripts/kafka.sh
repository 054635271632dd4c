#!/usr/bin/env bash
# A real, local, single-node Apache Kafka broker (KRaft, broker+controller in one JVM),
# for `make test`, the test fixtures and the demo. Needs only java (17+), mvn (first use) and,
# for the readiness check, python3 (the repo's .venv is preferred when present).
#
#   bash scripts/kafka.sh start|stop|restart|status|wipe|log
#
# Environment:
#   KAFKA_PORT              client port on 127.0.0.1 (default 19092); bootstrap = 127.0.0.1:$KAFKA_PORT
#   KAFKA_CONTROLLER_PORT   KRaft controller port (default KAFKA_PORT+1)
#   KAFKA_SECURITY          plaintext (default) or sasl_ssl: the client port speaks SASL_SSL with SCRAM-SHA-512
#                           over TLS signed by a CA of its own, ACLs are enforced (StandardAuthorizer), and
#                           users are created when the storage is formatted (first start); see "Secured
#                           broker" below
#   KAFKA_NODE_ID           KRaft node id (default 1)
#   KAFKA_QUORUM_VOTERS     controller.quorum.voters (default: this node alone); scripts/kafka_cluster.sh
#                           sets it, with KAFKA_CLUSTER_ID, to run several nodes
#   KAFKA_CLUSTER_ID        cluster id used when formatting (default: random)
#   KAFKA_REPLICATION       replication factor of new and internal topics (default 1); min.insync.replicas
#                           is then KAFKA_REPLICATION-1 (at least 1)
#   KAFKA_WAIT_READY        1 (default): start returns once the broker answers; 0: once the process runs
#   IOLSTREAM_KAFKA_DATA    state dir: server.properties, pid, kafka.log, data/ (default <repo>/.kafka/data-<port>)
#   IOLSTREAM_KAFKA_CACHE   dir of the jars (default ~/.cache/iolstream/kafka-<version>): lib-<pom hash>/,
#                           one per pom (a changed pom never replaces the jars a running broker uses), or
#                           lib/ when its .pom.sum matches; `kafka.sh jars` resolves them and prints the dir
#   KAFKA_HEAP_OPTS         default "-Xms256m -Xmx512m"
#   KAFKA_JVM_OPTS          extra JVM options
#   KAFKA_EXTRA_PROPERTIES  extra server.properties lines ("key=value", newline separated), appended last
#   KAFKA_START_TIMEOUT     seconds to wait for the broker to answer (default 90)
#   KAFKA_STOP_TIMEOUT      seconds to wait after SIGTERM before SIGKILL (default 30)
#   JAVA_HOME / MVN         java and maven to use (default: from PATH)
#
# Secured broker (KAFKA_SECURITY=sasl_ssl). In $IOLSTREAM_KAFKA_DATA/secure/ (made at the first start):
#   ca.pem, ca.key          the CA (openssl); clients trust ca.pem (ssl.ca.location)
#   broker.pem              the broker's key and certificate (CN=broker, SAN 127.0.0.1 and localhost), a PEM
#                           keystore; it also authenticates the broker to its controller listener (mutual TLS)
#   credentials             user=password, one a line, mode 600: admin (super user), worker, producer
#                           (KAFKA_SCRAM_USERS="name ..." adds others; passwords are random)
#   <user>.properties       client settings of each user for the Java tools (kafka-acls --command-config,
#                           the console producer and consumer)
# No user but admin may do anything until ACLs grant it (docs/operations.md lists the worker's).
#
# Exit codes: 0 ok (status: running), 3 status: stopped, 1 failure, 2 usage.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$SCRIPT_DIR/.." && pwd)"
POM="$SCRIPT_DIR/kafka/pom.xml"

PORT="${KAFKA_PORT:-19092}"
CONTROLLER_PORT="${KAFKA_CONTROLLER_PORT:-$((PORT + 1))}"
HOST=127.0.0.1
BOOTSTRAP="$HOST:$PORT"
STATE_DIR="${IOLSTREAM_KAFKA_DATA:-$REPO/.kafka/data-$PORT}"
START_TIMEOUT="${KAFKA_START_TIMEOUT:-90}"
STOP_TIMEOUT="${KAFKA_STOP_TIMEOUT:-30}"
SECURITY="${KAFKA_SECURITY:-plaintext}"
NODE_ID="${KAFKA_NODE_ID:-1}"
QUORUM_VOTERS="${KAFKA_QUORUM_VOTERS:-$NODE_ID@$HOST:$CONTROLLER_PORT}"
REPLICATION="${KAFKA_REPLICATION:-1}"
WAIT_READY="${KAFKA_WAIT_READY:-1}"
SCRAM_USERS="admin worker producer ${KAFKA_SCRAM_USERS:-}"
case "$SECURITY" in plaintext|sasl_ssl) ;; *) echo "kafka.sh: KAFKA_SECURITY must be plaintext or sasl_ssl, not '$SECURITY'" >&2; exit 2;; esac
[[ "$REPLICATION" =~ ^[1-9][0-9]*$ ]] || { echo "kafka.sh: KAFKA_REPLICATION must be a positive integer, not '$REPLICATION'" >&2; exit 2; }
MIN_ISR=$((REPLICATION > 1 ? REPLICATION - 1 : 1))

KAFKA_VERSION="$(sed -n 's:.*<kafka\.version>\(.*\)</kafka\.version>.*:\1:p' "$POM" | head -n1)"
[ -n "$KAFKA_VERSION" ] || { echo "kafka.sh: cannot read <kafka.version> from $POM" >&2; exit 1; }
CACHE_DIR="${IOLSTREAM_KAFKA_CACHE:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/iolstream/kafka-$KAFKA_VERSION}"
POM_SUM=""  # set below, once the functions exist
LIB_DIR="$CACHE_DIR/lib"  # or lib-<pom hash>: pick_lib_dir

PID_FILE="$STATE_DIR/kafka.pid"
LOG_FILE="$STATE_DIR/kafka.log"
PROPS="$STATE_DIR/server.properties"
LOG4J="$STATE_DIR/log4j2.properties"
DATA_DIR="$STATE_DIR/data"
SECURE_DIR="$STATE_DIR/secure"

if [ -n "${JAVA_HOME:-}" ] && [ -x "$JAVA_HOME/bin/java" ]; then JAVA="$JAVA_HOME/bin/java"; else JAVA=java; fi
MVN="${MVN:-mvn}"

log() { echo "kafka.sh[$PORT]: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# ---------------------------------------------------------------- helpers

# Run "$@" holding an exclusive lock on file $1 (flock if available; otherwise unlocked).
with_lock() {
    local lockfile="$1"; shift
    if command -v flock >/dev/null 2>&1; then
        mkdir -p "$(dirname "$lockfile")"
        (
            flock -w 600 9 || die "timed out waiting for lock $lockfile"
            "$@"
        ) 9>"$lockfile"
    else
        "$@"
    fi
}

port_open() {  # port_open PORT -> 0 if something accepts TCP connections on 127.0.0.1:PORT
    (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null
}

# 0 if $1 is a live process that is a Kafka broker (guards against recycled pids).
is_broker_pid() {
    local pid="$1"
    [ -n "$pid" ] || return 1
    kill -0 "$pid" 2>/dev/null || return 1
    if [ -r "/proc/$pid/cmdline" ]; then
        tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q 'kafka\.Kafka'
    elif command -v ps >/dev/null 2>&1; then
        ps -o command= -p "$pid" 2>/dev/null | grep -q 'kafka\.Kafka'
    else
        return 0
    fi
}

wait_exit() {  # wait_exit PID SECONDS -> 0 once PID is gone (a zombie counts as gone)
    local deadline=$((SECONDS + $2))
    while is_broker_pid "$1"; do
        [ "$SECONDS" -lt "$deadline" ] || return 1
        sleep 0.1
    done
}

running_pid() {  # prints the pid of our running broker, or fails; cleans a stale pid file
    local pid=""
    [ -f "$PID_FILE" ] && pid="$(cat "$PID_FILE" 2>/dev/null || true)"
    if is_broker_pid "$pid"; then echo "$pid"; return 0; fi
    [ -f "$PID_FILE" ] && rm -f "$PID_FILE"
    return 1
}

check_java() {
    command -v "$JAVA" >/dev/null 2>&1 || die "java not found (Kafka $KAFKA_VERSION needs Java 17+); install a JDK/JRE 17+ or set JAVA_HOME"
    local v major
    v="$("$JAVA" -version 2>&1 | sed -n 's/.*version "\([^"]*\)".*/\1/p' | head -n1)"
    major="${v%%.*}"
    [ "$major" = 1 ] && major="$(echo "$v" | cut -d. -f2)"
    if [[ "$major" =~ ^[0-9]+$ ]] && [ "$major" -lt 17 ]; then
        die "java $v is too old: Kafka $KAFKA_VERSION needs Java 17+ (set JAVA_HOME)"
    fi
}

pom_sum() {
    if command -v sha256sum >/dev/null 2>&1; then sha256sum "$POM" | cut -d' ' -f1
    elif command -v shasum >/dev/null 2>&1; then shasum -a 256 "$POM" | cut -d' ' -f1
    else cksum "$POM" | tr -c '0-9\n' '-' ; fi
}

# The jars of one pom live in a dir of their own, lib-<pom hash>: a pom that changes (another Kafka jar) is
# resolved into a new dir, never over the one a running broker was started from (its JVM opens jars
# lazily: replacing them under it breaks it). lib/ is used when its .pom.sum matches (a cache made
# before, or a dir of jars set up by hand with IOLSTREAM_KAFKA_CACHE).
has_jars() { [ -f "$1/.pom.sum" ] && [ "$(cat "$1/.pom.sum")" = "$POM_SUM" ] && compgen -G "$1/kafka_2.13-*.jar" >/dev/null; }

pick_lib_dir() {
    if has_jars "$CACHE_DIR/lib"; then LIB_DIR="$CACHE_DIR/lib"; else LIB_DIR="$CACHE_DIR/lib-${POM_SUM:0:16}"; fi
}

# Resolve the jars into $LIB_DIR (once per machine and pom): into a temp dir, then renamed to its final name
# (a new name: nothing in use is replaced).
resolve_jars_locked() {
    pick_lib_dir
    has_jars "$LIB_DIR" && return 0
    command -v "$MVN" >/dev/null 2>&1 || die "the Kafka jars are not cached in $LIB_DIR and mvn is not installed (install Maven 3.6+, or set IOLSTREAM_KAFKA_CACHE to a dir holding lib/)"
    local tmp="$CACHE_DIR/lib.tmp.$$" t0=$SECONDS
    log "resolving Kafka $KAFKA_VERSION jars with Maven into $LIB_DIR (first use of this pom; later starts reuse them) ..."
    rm -rf "$tmp"
    if ! "$MVN" -B -q -Dstyle.color=never -f "$POM" dependency:copy-dependencies -DoutputDirectory="$tmp" >"$CACHE_DIR/mvn.log" 2>&1; then
        tail -n 40 "$CACHE_DIR/mvn.log" >&2 || true
        rm -rf "$tmp"
        die "Maven could not resolve the Kafka jars (full output: $CACHE_DIR/mvn.log)"
    fi
    echo "$POM_SUM" >"$tmp/.pom.sum"
    rm -rf "$LIB_DIR"  # a partial dir of this pom (never complete: has_jars failed above)
    mv "$tmp" "$LIB_DIR"
    log "jars ready in $LIB_DIR ($(ls "$LIB_DIR" | grep -c '\.jar$') jars, $((SECONDS - t0)) s)"
}

resolve_jars() {
    pick_lib_dir
    has_jars "$LIB_DIR" && return 0
    mkdir -p "$CACHE_DIR"
    with_lock "$CACHE_DIR/.resolve.lock" resolve_jars_locked
    pick_lib_dir
}
POM_SUM="$(pom_sum)"
pick_lib_dir

write_config() {
    mkdir -p "$STATE_DIR" "$DATA_DIR"
    cat >"$PROPS" <<EOF
# Written by scripts/kafka.sh on every start; edits here are lost (use KAFKA_EXTRA_PROPERTIES).
process.roles=broker,controller
node.id=$NODE_ID
controller.quorum.voters=$QUORUM_VOTERS
controller.listener.names=CONTROLLER
log.dirs=$DATA_DIR
num.partitions=1
default.replication.factor=$REPLICATION
min.insync.replicas=$MIN_ISR
offsets.topic.replication.factor=$REPLICATION
offsets.topic.num.partitions=10
transaction.state.log.replication.factor=$REPLICATION
transaction.state.log.min.isr=$MIN_ISR
transaction.state.log.num.partitions=10
share.coordinator.state.topic.replication.factor=$REPLICATION
share.coordinator.state.topic.min.isr=$MIN_ISR
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=true
delete.topic.enable=true
num.network.threads=2
num.io.threads=4
num.recovery.threads.per.data.dir=2
EOF
    if [ "$SECURITY" = sasl_ssl ]; then write_secure_config; else
        cat >>"$PROPS" <<EOF
listeners=PLAINTEXT://$HOST:$PORT,CONTROLLER://$HOST:$CONTROLLER_PORT
advertised.listeners=PLAINTEXT://$HOST:$PORT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
EOF
    fi
    if [ -n "${KAFKA_EXTRA_PROPERTIES:-}" ]; then
        printf '# KAFKA_EXTRA_PROPERTIES\n%s\n' "$KAFKA_EXTRA_PROPERTIES" >>"$PROPS"
    fi
    cat >"$LOG4J" <<'EOF'
# Written by scripts/kafka.sh. Everything goes to stdout, which kafka.sh sends to kafka.log.
status = warn
name = iolstream-local-kafka
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = OUT
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.statechange.name = state.change.logger
logger.statechange.level = WARN
logger.authorizer.name = kafka.authorizer.logger
logger.authorizer.level = WARN
EOF
}

# ---------------------------------------------------------------- the secured broker

password_of() {  # password_of USER -> its password from $SECURE_DIR/credentials
    sed -n "s/^$1=//p" "$SECURE_DIR/credentials" | head -n1
}

# The CA, the broker's PEM keystore, a random password per user and each user's client properties; kept
# across restarts (the users live in the formatted storage), made again after a wipe.
make_secrets() {
    command -v openssl >/dev/null 2>&1 || die "KAFKA_SECURITY=sasl_ssl needs openssl"
    mkdir -p "$SECURE_DIR"
    chmod 700 "$SECURE_DIR"
    local d="$SECURE_DIR" u
    if [ ! -f "$d/broker.pem" ]; then
        log "making a CA and the broker's certificate in $d"
        (
            set -e
            umask 077
            openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=iolstream local CA" \
                -keyout "$d/ca.key" -out "$d/ca.pem" 2>/dev/null
            openssl req -newkey rsa:2048 -nodes -subj "/CN=broker" \
                -keyout "$d/broker.key" -out "$d/broker.csr" 2>/dev/null
            printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n' >"$d/broker.ext"
            openssl x509 -req -in "$d/broker.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial \
                -days 3650 -extfile "$d/broker.ext" -out "$d/broker.crt" 2>/dev/null
            # Kafka's PEM keystore: an unencrypted PKCS#8 key, then the certificate chain
            openssl pkcs8 -topk8 -nocrypt -in "$d/broker.key" -out "$d/broker.pk8"
            cat "$d/broker.pk8" "$d/broker.crt" "$d/ca.pem" >"$d/broker.pem"
            rm -f "$d/broker.key" "$d/broker.pk8" "$d/broker.csr" "$d/broker.ext" "$d/ca.srl"
        ) || die "openssl could not make the certificates in $d"
        chmod 644 "$d/ca.pem"
    fi
    touch "$d/credentials"
    chmod 600 "$d/credentials"
    for u in $SCRAM_USERS; do
        [[ "$u" =~ ^[A-Za-z0-9._-]+$ ]] || die "KAFKA_SCRAM_USERS: '$u' is not a plain user name"
        if [ -z "$(password_of "$u")" ]; then
            echo "$u=$(head -c 24 /dev/urandom | base64 | tr -d '/+=\n')" >>"$d/credentials"
        fi
        (umask 077; cat >"$d/$u.properties" <<EOF
# Client settings of user $u on the local secured broker (written by scripts/kafka.sh)
bootstrap.servers=$BOOTSTRAP
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="$u" password="$(password_of "$u")";
ssl.truststore.type=PEM
ssl.truststore.location=$d/ca.pem
EOF
        )
    done
}

# server.properties lines of the secured broker: clients on SASL_SSL (SCRAM-SHA-512), which is also the
# inter-broker listener (as admin); the controller listener takes only the broker's certificate (mutual TLS).
write_secure_config() {
    make_secrets
    cat >>"$PROPS" <<EOF
listeners=SASL_SSL://$HOST:$PORT,CONTROLLER://$HOST:$CONTROLLER_PORT
advertised.listeners=SASL_SSL://$HOST:$PORT
listener.security.protocol.map=SASL_SSL:SASL_SSL,CONTROLLER:SSL
inter.broker.listener.name=SASL_SSL
sasl.enabled.mechanisms=SCRAM-SHA-512
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="$(password_of admin)";
ssl.keystore.type=PEM
ssl.keystore.location=$SECURE_DIR/broker.pem
ssl.truststore.type=PEM
ssl.truststore.location=$SECURE_DIR/ca.pem
listener.name.controller.ssl.client.auth=required
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:admin;User:CN=broker
allow.everyone.if.no.acl.found=false
EOF
}

# --add-scram arguments of StorageTool format: every user with its password, one argument a line.
scram_args() {
    local u
    for u in $SCRAM_USERS; do
        printf '%s\n' "--add-scram" "SCRAM-SHA-512=[name=$u,password=$(password_of "$u")]"
    done
}

format_storage() {
    [ -f "$DATA_DIR/meta.properties" ] && return 0
    local cluster_id out
    # A random 16-byte Kafka Uuid, base64url without padding (what `kafka-storage random-uuid` prints).
    cluster_id="${KAFKA_CLUSTER_ID:-$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')}"
    local extra=()
    [ "$SECURITY" = sasl_ssl ] && mapfile -t extra < <(scram_args)
    log "formatting storage in $DATA_DIR (cluster id $cluster_id)"
    if ! out="$("$JAVA" -Xmx256m -cp "$LIB_DIR/*" -Dlog4j2.configurationFile="$LOG4J" \
            kafka.tools.StorageTool format --config "$PROPS" --cluster-id="$cluster_id" ${extra[@]+"${extra[@]}"} 2>&1)"; then
        echo "$out" >&2
        die "kafka-storage format failed"
    fi
}

# Wait until the broker answers a metadata request listing itself (so topics can be created).
wait_ready() {
    local pid="$1" deadline=$((SECONDS + START_TIMEOUT))
    while ! port_open "$PORT"; do
        if ! kill -0 "$pid" 2>/dev/null; then fail_start "the broker process exited during startup"; fi
        [ "$SECONDS" -lt "$deadline" ] || fail_start "port $PORT not open after ${START_TIMEOUT}s"
        sleep 0.2
    done
    local py=""
    if [ -x "$REPO/.venv/bin/python" ]; then py="$REPO/.venv/bin/python"
    elif command -v python3 >/dev/null 2>&1; then py=python3; fi
    local secure="" rc=0
    [ "$SECURITY" = sasl_ssl ] && secure="$SECURE_DIR"
    if [ -n "$py" ]; then
        local left=$((deadline - SECONDS)); [ "$left" -gt 5 ] || left=5
        "$py" - "$BOOTSTRAP" "$left" "$pid" "$secure" <<'PY' 2>/dev/null || rc=$?
import os, socket, struct, sys, time

bootstrap, budget, pid, secure = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
deadline = time.time() + budget
host, port = bootstrap.rsplit(":", 1)


def alive():
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def brokers_confluent():
    from confluent_kafka.admin import AdminClient
    conf = {"bootstrap.servers": bootstrap, "socket.connection.setup.timeout.ms": 3000}
    if secure:  # as the super user, over SASL_SSL
        with open(os.path.join(secure, "credentials")) as f:
            users = dict(line.strip().split("=", 1) for line in f if "=" in line)
        conf.update({"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
                     "sasl.username": "admin", "sasl.password": users["admin"],
                     "ssl.ca.location": os.path.join(secure, "ca.pem")})
    admin = AdminClient(conf)
    def check():
        return len(admin.list_topics(timeout=3).brokers)
    return check


def brokers_raw():
    # Metadata v4 request for no topics (non-flexible encoding), answer: broker count.
    def check():
        with socket.create_connection((host, int(port)), timeout=3) as s:
            body = struct.pack(">hhih", 3, 4, 1, 8) + b"kafka.sh" + struct.pack(">ib", 0, 0)
            s.sendall(struct.pack(">i", len(body)) + body)
            buf = b""
            while len(buf) < 16:
                chunk = s.recv(4096)
                if not chunk:
                    raise ConnectionError("closed")
                buf += chunk
            _size, _corr, _throttle, n = struct.unpack(">iiii", buf[:16])
            return n
    return check


try:
    check = brokers_confluent()
except ImportError:
    if secure:  # the raw request below speaks neither TLS nor SASL
        sys.exit(2)
    check = brokers_raw()
while True:
    try:
        if check() >= 1:
            sys.exit(0)
    except Exception as e:  # not ready yet
        last = e
    if not alive():
        print("broker process exited", file=sys.stderr)
        sys.exit(1)
    if time.time() > deadline:
        sys.exit(1)
    time.sleep(0.3)
PY
        case "$rc" in
            0) return 0 ;;
            2) ;;  # no confluent_kafka for SASL_SSL: the log line below
            *) kill -0 "$pid" 2>/dev/null || fail_start "the broker process exited during startup"
               fail_start "the broker did not answer a metadata request within ${START_TIMEOUT}s" ;;
        esac
    fi
    # No python (or no client of it that speaks SASL_SSL): the port is open; wait for the "started" line.
    until grep -q 'Kafka Server started' "$LOG_FILE" 2>/dev/null; do
        kill -0 "$pid" 2>/dev/null || fail_start "the broker process exited during startup"
        [ "$SECONDS" -lt "$deadline" ] || fail_start "no 'Kafka Server started' in the log after ${START_TIMEOUT}s"
        sleep 0.3
    done
}

fail_start() {
    log "ERROR: $1. Last lines of $LOG_FILE:"
    tail -n 60 "$LOG_FILE" >&2 2>/dev/null || true
    local pid
    if pid="$(running_pid)"; then kill -KILL "$pid" 2>/dev/null || true; fi
    rm -f "$PID_FILE"
    exit 1
}

# ---------------------------------------------------------------- commands

do_start_locked() {
    local pid
    if pid="$(running_pid)"; then
        log "already running (pid $pid) on $BOOTSTRAP"
        return 0
    fi
    for p in "$PORT" "$CONTROLLER_PORT"; do
        if port_open "$p"; then
            die "port $p on $HOST is already in use by another process (not a broker of this state dir: $STATE_DIR); choose another KAFKA_PORT"
        fi
    done
    check_java
    resolve_jars
    local t0=$SECONDS
    write_config
    format_storage
    [ -f "$LOG_FILE" ] && mv -f "$LOG_FILE" "$LOG_FILE.1"
    local heap="${KAFKA_HEAP_OPTS:--Xms256m -Xmx512m}"
    # shellcheck disable=SC2206
    local cmd=("$JAVA" $heap -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:+ExitOnOutOfMemoryError
               -Djava.awt.headless=true -Dlog4j2.configurationFile="$LOG4J" -Dlog4j2.shutdownHookEnabled=false
               -Dkafka.logs.dir="$STATE_DIR" ${KAFKA_JVM_OPTS:-}
               -cp "$LIB_DIR/*" kafka.Kafka "$PROPS")
    # Detached (own session, no inherited stdio, not holding the lock fd 9) so that it outlives
    # this script and its caller.
    if command -v setsid >/dev/null 2>&1; then
        setsid "${cmd[@]}" </dev/null >"$LOG_FILE" 2>&1 9>&- &
    else
        nohup "${cmd[@]}" </dev/null >"$LOG_FILE" 2>&1 9>&- &
    fi
    pid=$!
    echo "$pid" >"$PID_FILE"
    log "starting Kafka $KAFKA_VERSION (pid $pid) on $BOOTSTRAP, controller :$CONTROLLER_PORT, log $LOG_FILE"
    if [ "$WAIT_READY" = 0 ]; then  # a node of a cluster: it answers once a quorum of controllers runs
        sleep 0.5
        kill -0 "$pid" 2>/dev/null || fail_start "the broker process exited during startup"
        return 0
    fi
    wait_ready "$pid"
    log "ready on $BOOTSTRAP ($SECURITY) after $((SECONDS - t0)) s"
}

do_stop_locked() {
    local pid
    if ! pid="$(running_pid)"; then
        log "not running"
        return 0
    fi
    log "stopping (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    if ! wait_exit "$pid" "$STOP_TIMEOUT"; then
        log "still alive after ${STOP_TIMEOUT}s, sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        wait_exit "$pid" 10 || die "pid $pid survived SIGKILL"
    fi
    rm -f "$PID_FILE"
    log "stopped"
}

do_wipe_locked() {
    local pid
    if pid="$(running_pid)"; then  # its data is about to go: no need for a graceful shutdown
        log "killing (pid $pid)"
        kill -KILL "$pid" 2>/dev/null || true
        wait_exit "$pid" 10 || die "pid $pid survived SIGKILL"
        rm -f "$PID_FILE"
    fi
    case "$STATE_DIR" in
        ""|"/"|"$HOME"|"$REPO") die "refusing to wipe '$STATE_DIR'";;
    esac
    rm -rf "$STATE_DIR"
    log "wiped $STATE_DIR"
}

do_status() {
    local pid
    if pid="$(running_pid)"; then
        echo "running (pid $pid) on $BOOTSTRAP, Kafka $KAFKA_VERSION, state $STATE_DIR"
        return 0
    fi
    echo "stopped ($BOOTSTRAP, state $STATE_DIR)"
    return 3
}

LOCK_FILE="${STATE_DIR%/}.lock"
cmd="${1:-}"
case "$cmd" in
    start)   with_lock "$LOCK_FILE" do_start_locked ;;
    stop)    with_lock "$LOCK_FILE" do_stop_locked ;;
    restart) with_lock "$LOCK_FILE" do_stop_locked; with_lock "$LOCK_FILE" do_start_locked ;;
    status)  do_status ;;
    wipe)    with_lock "$LOCK_FILE" do_wipe_locked ;;
    log)     echo "$LOG_FILE" >&2; tail -n "${2:-100}" "$LOG_FILE" ;;
    jars)    resolve_jars; echo "$LIB_DIR" ;;
    *) echo "usage: $0 start|stop|restart|status|wipe|log [lines]|jars   (env KAFKA_PORT=$PORT)" >&2; exit 2 ;;
esac
