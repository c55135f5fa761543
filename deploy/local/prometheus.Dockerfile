# Prometheus from Debian's package, laid out like the upstream prom/prometheus image (entrypoint the
# server, working directory and data under /prometheus, config /etc/prometheus/prometheus.yml), for
# the local compose run where no image registry is reachable (deploy/docker-compose.local.yml).
ARG BASE_IMAGE=localhost/debian-base:bookworm
FROM ${BASE_IMAGE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends prometheus \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /prometheus \
    && chown prometheus:prometheus /prometheus
USER prometheus
WORKDIR /prometheus
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
