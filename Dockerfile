# replog from this repository: brokers, controllers and Spark jobs run from this one image.
FROM python:3.11-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY . /app
RUN pip install --no-cache-dir /app
ENV PYSPARK_PYTHON=python3
