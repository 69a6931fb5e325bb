# Prometheus from Debian's package, for compose.yaml's `prometheus` service. `make image`
# builds it FROM debian:bookworm-slim where that can be pulled, else from a base made with
# debootstrap that has the package already (then apt is not needed here).
ARG BASE=debian:bookworm-slim
FROM ${BASE}
RUN command -v prometheus >/dev/null || { apt-get update \
        && apt-get install -y --no-install-recommends prometheus \
        && rm -rf /var/lib/apt/lists/*; }
RUN install -d -o prometheus -g prometheus /prometheus
USER prometheus
ENTRYPOINT ["prometheus"]
EXPOSE 9090
