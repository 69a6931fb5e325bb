#!/bin/sh
# The kvstack image's entrypoint: runs its command as the kvstack user.
#
# Compose mounts each secret under /run/secrets as the host's own file: its owner and mode
# (0600, from `kvstack auth init`) are the host user's, so the kvstack user cannot read
# it. As root, this copies them to /run/kvstack-secrets, readable by kvstack alone, points
# every argument and variable naming /run/secrets/... there, and drops to kvstack.
set -eu

FROM=/run/secrets
TO=/run/kvstack-secrets

if [ "$(id -u)" = 0 ]; then
    if [ -d "$FROM" ]; then
        rm -rf "$TO"
        install -d -o kvstack -g kvstack -m 0700 "$TO"
        cp -RL "$FROM/." "$TO/"
        chown -R kvstack:kvstack "$TO"
        chmod -R go-rwx "$TO"
    fi
    exec setpriv --reuid=kvstack --regid=kvstack --init-groups env HOME=/home/kvstack "$0" "$@"
fi

if [ -d "$TO" ]; then
    for name in $(env | sed -n "s|^\([A-Za-z_][A-Za-z0-9_]*\)=$FROM/.*|\1|p"); do
        eval "value=\${$name}"
        export "$name=$TO/${value#"$FROM"/}"
    done
    for arg do
        shift
        case $arg in "$FROM"/*) arg="$TO/${arg#"$FROM"/}" ;; esac
        set -- "$@" "$arg"
    done
fi
exec "$@"
