#!/bin/bash
# Healthy when the broker answers a Kafka ApiVersions request (v0) on localhost:${1:-9092} with
# our correlation id. A KRaft broker serves requests only once it has caught up with the
# controller's metadata, so this means "ready for clients". Plain bash: the image has no Kafka CLI.
set -euo pipefail
port="${1:-9092}"
exec 3<>"/dev/tcp/127.0.0.1/$port"
# size 16 | api_key 18 (ApiVersions) | version 0 | correlation id 0x10c | client id "health" (6)
printf '\x00\x00\x00\x10\x00\x12\x00\x00\x00\x00\x01\x0c\x00\x06health' >&3
reply="$(timeout 5 head -c 10 <&3 | od -An -tx1 | tr -d ' \n')"
# size (4 bytes) | correlation id 0000010c | error code 0000
[ "${reply:8:12}" = "0000010c0000" ] || { echo "no ApiVersions answer on port $port: '$reply'" >&2; exit 1; }
