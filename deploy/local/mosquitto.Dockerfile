# Mosquitto from Debian's package, laid out like the upstream eclipse-mosquitto image (config under
# /mosquitto/config, the same command), for the local compose run where no image registry is reachable
# (deploy/docker-compose.local.yml). Runs as root and drops to the mosquitto user, as upstream does.
ARG BASE_IMAGE=localhost/debian-base:bookworm
FROM ${BASE_IMAGE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends mosquitto \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /mosquitto/config /mosquitto/data /mosquitto/log \
    && chown -R mosquitto:mosquitto /mosquitto
EXPOSE 1883
CMD ["/usr/sbin/mosquitto", "-c", "/mosquitto/config/mosquitto.conf"]
