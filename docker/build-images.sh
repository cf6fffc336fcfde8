#!/usr/bin/env bash
# The Docker demo's images, built on a machine that can pull none (docker-compose.local-s3.yml
# runs the topology on them):
#   replog-base:bookworm   Debian 12 from Debian's mirror (debootstrap --variant=minbase, then
#                          docker import); built only when missing ($REPLOG_BASE_IMAGE names
#                          another bookworm image to build on instead)
#   replog:dev             the project's Dockerfile on that base
#   replog-s3:dev          moto's S3 server on that base (docker/s3-server.Dockerfile)
# Docker's layer cache makes a second run quick: only layers whose inputs changed are built.
# Needs root (debootstrap) and a running engine (docker/start-engine.sh).
#   docker/build-images.sh
set -euo pipefail
cd "$(dirname "$0")/.."
base="${REPLOG_BASE_IMAGE:-replog-base:bookworm}"
if ! docker image inspect "$base" >/dev/null 2>&1; then
  if [ "$base" != replog-base:bookworm ]; then
    echo "base image $base is not here: pull or build it, or unset REPLOG_BASE_IMAGE" >&2
    exit 1
  fi
  command -v debootstrap >/dev/null || { echo "apt-get install debootstrap, then retry" >&2; exit 1; }
  root="$(mktemp -d /tmp/replog-base.XXXXXX)"
  trap 'rm -rf "$root"' EXIT
  echo "building $base with debootstrap (about 2 minutes)" >&2
  debootstrap --variant=minbase bookworm "$root" "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" >&2
  tar -C "$root" -c . | docker import - "$base" >/dev/null
fi
# certificates this machine trusts besides its distribution's (a TLS-intercepting proxy's CA):
# pip inside the build needs them to reach PyPI through the same proxy
extra=""
for cert in /usr/local/share/ca-certificates/*.crt; do
  if [ -e "$cert" ]; then
    extra+="$(cat "$cert")"$'\n'
  fi
done
docker build -q --build-arg BASE="$base" --build-arg EXTRA_CA_CERTS="$extra" -t replog:dev . >&2
docker build -q --build-arg BASE="$base" --build-arg EXTRA_CA_CERTS="$extra" -t replog-s3:dev \
  -f docker/s3-server.Dockerfile docker >&2
echo "built replog:dev and replog-s3:dev on $base" >&2
