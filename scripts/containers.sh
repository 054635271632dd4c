#!/usr/bin/env bash
# The container images of docker/, built with podman from Debian packages (no image registry needed):
#   base        Debian bookworm (debootstrap, minbase + python3, python3-venv, ca-certificates)
#   iolstream   docker/Dockerfile            on the base (pip installs the package's dependencies)
#   kafka       docker/kafka/Dockerfile      on the base: Debian's JRE + the jars of scripts/kafka/pom.xml
#   prometheus  docker/prometheus/Dockerfile on the base: Debian's prometheus package
#
#   bash scripts/containers.sh setup    with IOLSTREAM_INSTALL_SYSTEM=1: install podman, runc, debootstrap (apt, as root)
#                                       if missing (else exit 3 naming them); write the podman config
#   bash scripts/containers.sh build    setup, then build what is missing; prints the image names (also in $STATE/images.env)
#   bash scripts/containers.sh clean    remove this script's images and state
#
# Each image is tagged with a digest of its inputs (the files it copies, its Dockerfile, its base
# image's id): an unchanged input set reuses the image, any edit rebuilds it. Pip resolves the
# dependency versions at build time, so a cached image keeps the versions of its build (`clean` to refresh).
# The base image is keyed by its debootstrap arguments and mirror only: `clean` to take newer Debian packages.
#
# Podman runs with runc and cgroupfs (crun refuses this machine's hybrid cgroup layout) and without
# default ulimits (setrlimit is not permitted here), from a containers.conf of this script's own
# (CONTAINERS_CONF); the system's /etc/containers files are left alone.
#
# Environment:
#   IOLSTREAM_CONTAINER_STATE  state dir (default ~/.cache/iolstream/containers)
#   DEBIAN_MIRROR              debootstrap mirror (default: the first Debian URI of the apt sources)
#   IOLSTREAM_KAFKA_CACHE      dir whose lib/ holds the Kafka jars (as scripts/kafka.sh; resolved with mvn if absent)
#
# Exit codes: 0 ok, 1 failure, 2 usage, 3 no working podman here (not root; podman, runc or debootstrap
# missing and IOLSTREAM_INSTALL_SYSTEM not 1, or no apt, or apt failed; or `podman info` fails).
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$SCRIPT_DIR/.." && pwd)"
STATE="${IOLSTREAM_CONTAINER_STATE:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/iolstream/containers}"
POM="$REPO/scripts/kafka/pom.xml"
SUITE=bookworm
BASE_PACKAGES=python3,python3-venv,ca-certificates

log() { echo "containers.sh: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

podman_() { CONTAINERS_CONF="$STATE/containers.conf" podman "$@"; }

sha() { sha256sum | cut -c1-16; }

# ---------------------------------------------------------------- setup
do_setup() {
    if [ "$(id -u)" != 0 ]; then  # debootstrap needs root, and the images live in root's podman storage
        log "needs root (debootstrap and podman's system storage); run it as root"
        exit 3
    fi
    local missing=()
    for tool in podman runc debootstrap; do command -v "$tool" >/dev/null 2>&1 || missing+=("$tool"); done
    if [ "${#missing[@]}" -gt 0 ]; then
        if [ "${IOLSTREAM_INSTALL_SYSTEM:-0}" != 1 ]; then  # nothing system-wide unless asked
            log "${missing[*]} not installed; install them, or set IOLSTREAM_INSTALL_SYSTEM=1 to let this script apt-get install them"
            exit 3
        fi
        if ! command -v apt-get >/dev/null 2>&1; then
            log "cannot install ${missing[*]}: no apt-get here (Debian/Ubuntu); install podman, runc and debootstrap yourself"
            exit 3
        fi
        log "installing ${missing[*]} (apt-get) ..."
        local t0=$SECONDS
        if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc debootstrap; } \
                >"$STATE/apt.log" 2>&1; then
            tail -n 30 "$STATE/apt.log" >&2
            log "apt-get could not install podman, runc, debootstrap (full output: $STATE.apt.log)"
            exit 3
        fi
        log "installed in $((SECONDS - t0)) s"
    fi
    mkdir -p "$STATE"
    cat >"$STATE/containers.conf.tmp" <<'EOF'
# Written by scripts/containers.sh (CONTAINERS_CONF for its podman calls).
[containers]
default_ulimits = []
log_driver = "k8s-file"

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
    mv "$STATE/containers.conf.tmp" "$STATE/containers.conf"
    if ! podman_ info >/dev/null 2>"$STATE/podman-info.err"; then
        tail -n 5 "$STATE/podman-info.err" >&2
        log "podman does not work here (podman info failed, see above)"
        exit 3
    fi
}

# ---------------------------------------------------------------- inputs
debian_mirror() {
    if [ -n "${DEBIAN_MIRROR:-}" ]; then echo "$DEBIAN_MIRROR"; return; fi
    local uri
    uri="$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | sed -n 's/^URIs:[[:space:]]*//p' | tr ' ' '\n' \
           | grep -v -e security -e '^$' | head -n1 || true)"
    [ -n "$uri" ] || uri="$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
           | awk '$1 == "deb" && $0 !~ /security/ {print $2; exit}' || true)"
    echo "${uri:-http://deb.debian.org/debian}"
}

# Digest of files (paths relative to the repo, then contents), in a stable order.
files_digest() {
    local f
    for f in "$@"; do printf '%s\n' "$f"; sha256sum <"$REPO/$f"; done | sha
}

# The files of docker/Dockerfile's build context (what Dockerfile.dockerignore lets in).
worker_inputs() {
    (cd "$REPO" && { echo docker/Dockerfile; echo docker/Dockerfile.dockerignore; echo pyproject.toml
                     echo docker/worker.yaml; echo docker/healthcheck.py
                     find iolstream -type f ! -path '*/__pycache__/*' ! -name '*.pyc' ! -name '*.nbi' ! -name '*.nbc'; } \
        | LC_ALL=C sort)
}

image_id() { podman_ image inspect --format '{{.Id}}' "$1"; }

# build_once NAME KEY COMMAND...: run COMMAND (which must create localhost/NAME:KEY) unless that image exists.
build_once() {
    local name="$1" key="$2"; shift 2
    local ref="localhost/$name:$key"
    if podman_ image exists "$ref"; then
        log "$ref: cached"
        echo "cached 0" >"$STATE/$name.build"
    else
        local t0=$SECONDS
        log "$ref: building (log: $STATE/$name.build.log) ..."
        if ! "$@" >"$STATE/$name.build.log" 2>&1; then
            tail -n 40 "$STATE/$name.build.log" >&2
            die "building $ref failed (full log: $STATE/$name.build.log)"
        fi
        log "$ref: built in $((SECONDS - t0)) s"
        echo "built $((SECONDS - t0))" >"$STATE/$name.build"
    fi
    podman_ tag "$ref" "localhost/$name:dev"
    # earlier builds of this image (other keys) are removed, with the layers only they used (not those
    # the new one shares: the dependencies' layer stays cached); one a container still uses is kept
    local old
    for old in $(podman_ images --format '{{.Repository}}:{{.Tag}}' "localhost/$name"); do
        case "$old" in *":$key"|*":dev") ;; *) podman_ rmi "$old" >/dev/null 2>&1 || true ;; esac
    done
}

# (each step checked: build_once calls this in an `if`, where bash's errexit does not apply)
make_base() {
    local rootfs="$STATE/rootfs.$$"
    rm -rf "$rootfs"
    debootstrap --variant=minbase --include="$BASE_PACKAGES" "$SUITE" "$rootfs" "$(debian_mirror)" || return 1
    [ -x "$rootfs/usr/bin/python3" ] || { echo "debootstrap made no python3 in $rootfs"; return 1; }
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -c . | podman_ import --change 'CMD ["/bin/bash"]' - "$1" || return 1
    rm -rf "$rootfs"
}

# pip in the build reaches the package index as the host's pip does: its config and CA bundle, mounted
build_worker() {
    local mounts=() ca="${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}"
    [ -f "$ca" ] && mounts+=(-v "$ca:/etc/ssl/certs/ca-certificates.crt:ro")
    [ -f /etc/pip.conf ] && mounts+=(-v /etc/pip.conf:/etc/pip.conf:ro)
    podman_ build --format docker --network host "${mounts[@]}" --build-arg "BASE_IMAGE=$BASE" \
        -f docker/Dockerfile --ignorefile docker/Dockerfile.dockerignore -t "$1" "$REPO"
}

build_dir() {  # build_dir CONTEXT IMAGE
    podman_ build --format docker --network host --build-arg "BASE_IMAGE=$BASE" -t "$2" "$1"
}

kafka_lib() {
    local version pom_sum lib
    version="$(sed -n 's:.*<kafka\.version>\(.*\)</kafka\.version>.*:\1:p' "$POM" | head -n1)"
    pom_sum="$(sha256sum "$POM" | cut -d' ' -f1)"
    local cache="${IOLSTREAM_KAFKA_CACHE:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/iolstream/kafka-$version}"
    for lib in "$cache/lib-${pom_sum:0:16}" "$cache/lib"; do  # where scripts/kafka.sh resolves them
        if [ "$(cat "$lib/.pom.sum" 2>/dev/null)" = "$pom_sum" ] && compgen -G "$lib/kafka_2.13-*.jar" >/dev/null; then
            echo "$lib"; return
        fi
    done
    lib="$STATE/kafka-lib-${pom_sum:0:16}"
    if ! compgen -G "$lib/kafka_2.13-*.jar" >/dev/null; then
        command -v mvn >/dev/null 2>&1 || die "the Kafka jars are not cached and mvn is not installed"
        log "resolving the Kafka jars with Maven into $lib ..."
        mvn -B -q -f "$POM" dependency:copy-dependencies -DoutputDirectory="$lib.tmp" >"$STATE/mvn.log" 2>&1 \
            || { tail -n 30 "$STATE/mvn.log" >&2; die "Maven could not resolve the Kafka jars"; }
        mv "$lib.tmp" "$lib"
    fi
    echo "$lib"
}

do_build_locked() {
    local t_all=$SECONDS
    BASE_KEY="$(printf '%s\n' "$SUITE" minbase "$BASE_PACKAGES" "$(debian_mirror)" | sha)"
    build_once iolstream-base "$BASE_KEY" make_base "localhost/iolstream-base:$BASE_KEY"
    BASE="localhost/iolstream-base:$BASE_KEY"
    local base_id; base_id="$(image_id "$BASE")"

    local inputs key
    mapfile -t inputs < <(worker_inputs)
    key="$( { echo "$base_id"; files_digest "${inputs[@]}"; } | sha)"
    build_once iolstream "$key" build_worker "localhost/iolstream:$key"
    WORKER="localhost/iolstream:$key"

    # the Kafka build context: this directory's scripts and the jars (hard links when possible)
    local lib ctx="$STATE/kafka-context"
    lib="$(kafka_lib)"
    rm -rf "$ctx" && mkdir -p "$ctx/lib"
    cp "$REPO"/docker/kafka/{Dockerfile,entrypoint.sh,healthcheck.sh} "$ctx/"
    cp -l "$lib"/*.jar "$ctx/lib/" 2>/dev/null || cp "$lib"/*.jar "$ctx/lib/"
    key="$( { echo "$base_id"; (cd "$ctx" && find . -type f | LC_ALL=C sort | xargs sha256sum); } | sha)"
    build_once iolstream-kafka "$key" build_dir "$ctx" "localhost/iolstream-kafka:$key"
    KAFKA="localhost/iolstream-kafka:$key"

    key="$( { echo "$base_id"; files_digest docker/prometheus/Dockerfile docker/prometheus/prometheus.yml; } | sha)"
    build_once iolstream-prometheus "$key" build_dir "$REPO/docker/prometheus" "localhost/iolstream-prometheus:$key"
    PROMETHEUS="localhost/iolstream-prometheus:$key"

    # layers no image uses any more (failed builds, the build stage's of earlier sources), after a day:
    # the newer ones are the cache of the next build (the dependencies' layer, ~1 min of pip)
    podman_ image prune -f --filter until=24h >/dev/null || true

    cat >"$STATE/images.env.tmp" <<EOF
CONTAINERS_CONF=$STATE/containers.conf
IOLSTREAM_IMAGE=$WORKER
IOLSTREAM_KAFKA_IMAGE=$KAFKA
IOLSTREAM_PROMETHEUS_IMAGE=$PROMETHEUS
EOF
    mv "$STATE/images.env.tmp" "$STATE/images.env"
    log "images ready in $((SECONDS - t_all)) s: $(for n in iolstream-base iolstream iolstream-kafka iolstream-prometheus; do
        printf '%s %s s; ' "$n" "$(cat "$STATE/$n.build")"; done)"
    cat "$STATE/images.env"
}

with_lock() {
    mkdir -p "$STATE"
    ( flock -w 1800 9 || die "timed out waiting for $STATE/lock"; "$@" ) 9>"$STATE/lock"
}

do_clean() {
    if command -v podman >/dev/null 2>&1 && [ -f "$STATE/containers.conf" ]; then
        local refs
        refs="$(podman_ images --format '{{.Repository}}:{{.Tag}}' \
                | grep -E '^localhost/iolstream(-base|-kafka|-prometheus)?:' || true)"
        [ -z "$refs" ] || echo "$refs" | xargs env CONTAINERS_CONF="$STATE/containers.conf" podman rmi -f >/dev/null
        podman_ image prune -f >/dev/null || true
    fi
    case "$STATE" in ""|"/"|"$HOME"|"$REPO") die "refusing to remove '$STATE'";; esac
    rm -rf "$STATE"
    log "removed the images and $STATE"
}

case "${1:-}" in
    setup) mkdir -p "$STATE"; do_setup ;;
    build) mkdir -p "$STATE"; do_setup; cd "$REPO"; with_lock do_build_locked ;;
    clean) do_clean ;;
    *) echo "usage: $0 setup|build|clean" >&2; exit 2 ;;
esac
