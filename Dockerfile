# replog from this repository: brokers, controllers and Spark jobs run from this one image.
# Debian 12 (bookworm): its packages carry Java 17, the Java Spark 4 needs, and Python 3.11.
#
# BASE is any bookworm image: python:3.11-slim-bookworm (the default, pulled from Docker Hub),
# or plain Debian where nothing can be pulled (docker/build-images.sh builds one with
# debootstrap and builds this file on it). replog lives in a virtual environment, /opt/replog,
# on either base, so pip never touches the system's Python.
#   docker build -t replog:dev .
#   docker build --build-arg BASE=replog-base:bookworm -t replog:dev .
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}
ENV DEBIAN_FRONTEND=noninteractive
# Java for the Spark job; Debian's python3 and venv only where the base has no Python
RUN set -eu; \
    python=""; command -v python3 >/dev/null || python="python3 python3-venv"; \
    apt-get update; \
    apt-get install -y --no-install-recommends ca-certificates openjdk-17-jre-headless procps $python; \
    rm -rf /var/lib/apt/lists/*
# Certificates to trust besides Debian's (PEM text), for a build behind a TLS-intercepting
# proxy: docker/build-images.sh passes the host's /usr/local/share/ca-certificates here.
ARG EXTRA_CA_CERTS=""
RUN set -eu; \
    if [ -n "$EXTRA_CA_CERTS" ]; then \
      printf '%s\n' "$EXTRA_CA_CERTS" > /usr/local/share/ca-certificates/build-extra.crt; \
      update-ca-certificates; \
    fi; \
    python3 -m venv /opt/replog
# pip trusts the system's store (with the certificates above), not its own copy of certifi's
ENV PATH=/opt/replog/bin:$PATH VIRTUAL_ENV=/opt/replog PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1
WORKDIR /app
# The dependencies first (replog's and the Spark extra's, read from pyproject.toml), in a
# layer of their own: a change to the code rebuilds only the layer below.
COPY pyproject.toml /app/
RUN python3 -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print('\n'.join(p['dependencies'] + p['optional-dependencies']['spark']))" > /tmp/requirements.txt \
 && pip install --no-cache-dir -r /tmp/requirements.txt \
 && rm /tmp/requirements.txt
COPY . /app
# the Spark extra: this image also runs the Spark job (a broker-only image would install /app)
RUN pip install --no-cache-dir --no-deps /app
ENV PYSPARK_PYTHON=/opt/replog/bin/python3
