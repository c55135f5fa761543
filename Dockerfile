# One image for every gigacluster service: `docker run IMAGE serve chip ...`, `... serve router ...`.
# deploy/docker-compose.yml and deploy/k8s/ run it once per service (chip once per shard).
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
# Dependencies and the package first, so editing docs or examples does not rebuild this layer.
COPY pyproject.toml README.md ./
COPY services ./services
RUN pip install . \
    && useradd --system --uid 10001 --home-dir /var/lib/gigacluster --create-home gigacluster
COPY examples ./examples
COPY loadtest ./loadtest

# Containers bind every interface; durable state (scheduler SQLite, audit log) lives in the volume.
ENV GIGACLUSTER_HOST=0.0.0.0 \
    GIGACLUSTER_HOME=/var/lib/gigacluster
VOLUME ["/var/lib/gigacluster"]
USER gigacluster
# gRPC: chip 50051, fabric 50052, broker 50053, scheduler 50054, router 50055;
# router OpenAI-compatible HTTP 8000; Prometheus /metrics 9464 on every service.
EXPOSE 50051 50052 50053 50054 50055 8000 9464
ENTRYPOINT ["gigacluster"]
CMD ["--help"]
