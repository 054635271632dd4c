#!/bin/bash
# Start one Kafka node configured from the environment, as the apache/kafka image does:
# KAFKA_<NAME>=value becomes the server.properties line name=value, with the name lowercased,
# "___" -> "-", "__" -> "_" and "_" -> "." (KAFKA_PROCESS_ROLES -> process.roles). The storage
# is formatted on first start with CLUSTER_ID (a fixed default, as in apache/kafka).
set -euo pipefail
CONFIG=/opt/kafka/config/server.properties
LOG4J=/opt/kafka/config/log4j2.properties
: "${CLUSTER_ID:=5L6g3nShT-eMCtK--X86sw}"
: "${KAFKA_HEAP_OPTS:=-Xms256m -Xmx512m}"
{
    echo "# written by $0 from the KAFKA_* environment"
    while IFS='=' read -r -d '' name value; do
        case "$name" in
            KAFKA_HEAP_OPTS|KAFKA_JVM_OPTS) continue ;;
            KAFKA_*) ;;
            *) continue ;;
        esac
        key="${name#KAFKA_}"
        key="${key,,}"
        key="${key//___/-}"
        key="${key//__/@}"
        key="${key//_/.}"
        echo "${key//@/_}=$value"
    done < <(env -0)
} >"$CONFIG"
cat >"$LOG4J" <<'LOG'
status = warn
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
LOG
JAVA_OPTS=(-Dlog4j2.configurationFile="$LOG4J" -Djava.awt.headless=true)
log_dir="$(sed -n 's/^log\.dirs=//p' "$CONFIG" | cut -d, -f1)"
if [ -n "$log_dir" ] && [ ! -f "$log_dir/meta.properties" ]; then
    java -Xmx256m "${JAVA_OPTS[@]}" -cp '/opt/kafka/libs/*' kafka.tools.StorageTool format \
        --config "$CONFIG" --cluster-id "$CLUSTER_ID" --ignore-formatted
fi
# shellcheck disable=SC2086
exec java $KAFKA_HEAP_OPTS -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:+ExitOnOutOfMemoryError "${JAVA_OPTS[@]}" \
    ${KAFKA_JVM_OPTS:-} -cp '/opt/kafka/libs/*' kafka.Kafka "$CONFIG"
