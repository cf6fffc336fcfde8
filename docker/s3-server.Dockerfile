# moto's S3 server (moto[server], the S3 server replog's own tests run against): the Docker
# demo's S3 service where MinIO's image cannot be pulled (docker-compose.local-s3.yml). A
# stand-in for tests and demos: it keeps objects in memory. Built on the same base as the
# project's image (docker/build-images.sh), but not on it: a change to replog's code does not
# rebuild it.
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}
ENV DEBIAN_FRONTEND=noninteractive
RUN set -eu; \
    python=""; command -v python3 >/dev/null || python="python3 python3-venv"; \
    apt-get update; \
    apt-get install -y --no-install-recommends ca-certificates $python; \
    rm -rf /var/lib/apt/lists/*
# as in the project's Dockerfile: certificates to trust besides Debian's (PEM text)
ARG EXTRA_CA_CERTS=""
RUN set -eu; \
    if [ -n "$EXTRA_CA_CERTS" ]; then \
      printf '%s\n' "$EXTRA_CA_CERTS" > /usr/local/share/ca-certificates/build-extra.crt; \
      update-ca-certificates; \
    fi; \
    python3 -m venv /opt/moto
ENV PATH=/opt/moto/bin:$PATH PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN pip install --no-cache-dir "moto[server]==5.2.1"
EXPOSE 9000
ENTRYPOINT ["moto_server", "--host", "0.0.0.0", "--port", "9000"]
CMD []
