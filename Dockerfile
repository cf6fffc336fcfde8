# replog from this repository: brokers, controllers and Spark jobs run from this one image.
# Pinned to Debian 12 (bookworm), whose packages carry Java 17, the Java Spark 4 needs.
FROM python:3.11-slim-bookworm
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY . /app
# the Spark extra: this image also runs the Spark job (a broker-only image would install /app)
RUN pip install --no-cache-dir "/app[spark]"
ENV PYSPARK_PYTHON=python3
