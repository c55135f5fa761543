# One image for every gigacluster service: `docker run IMAGE serve chip ...`, `... serve router ...`.
# deploy/docker-compose.yml and deploy/k8s/ run it once per service (chip once per shard).
#
# BASE_IMAGE: the official Python image by default. Where no image registry is reachable,
# deploy/local/make-base-image.sh makes a bare Debian base from Debian's packages and the local
# compose run builds on it (--build-arg BASE_IMAGE=localhost/debian-base:bookworm); a base with no
# python3 gets Debian's (3.11 on bookworm). Either way the package lives in the venv /opt/gigacluster.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE} AS base

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/gigacluster \
    PATH=/opt/gigacluster/bin:$PATH

RUN if ! command -v python3 >/dev/null 2>&1; then \
      apt-get update \
      && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
      && rm -rf /var/lib/apt/lists/*; \
    fi \
    && python3 -m venv /opt/gigacluster \
    && useradd --system --uid 10001 --home-dir /var/lib/gigacluster --create-home gigacluster

# The runtime dependencies, read from pyproject.toml in a stage of their own: the install below is
# redone when that list changes, not on every edit of pyproject.toml, the README or the code.
FROM base AS requirements
COPY pyproject.toml /tmp/
RUN python3 -c "import tomllib; print('\n'.join(tomllib.load(open('/tmp/pyproject.toml', 'rb'))['project']['dependencies']))" \
      > /tmp/requirements.txt

FROM base
COPY --from=requirements /tmp/requirements.txt /tmp/requirements.txt
RUN pip install -r /tmp/requirements.txt && rm /tmp/requirements.txt
WORKDIR /app
COPY pyproject.toml README.md ./
COPY services ./services
RUN pip install --no-deps . && rm -rf build services/*.egg-info
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
