#!/usr/bin/env bash
# Start a Docker engine unless one answers already: Debian's dockerd, as root, in the
# background, its log in $REPLOG_DOCKERD_LOG (default /var/log/replog-dockerd.log). Waits
# until `docker info` answers, then prints dockerd's process id (nothing if one was running).
#   docker/start-engine.sh
set -euo pipefail
if docker info >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "no Docker engine answers, and only root can start dockerd: start it (sudo dockerd &)," \
    "or run this as root" >&2
  exit 1
fi
if ! command -v dockerd >/dev/null 2>&1; then
  echo "dockerd is not installed: apt-get install docker.io (Debian's Docker engine)" >&2
  exit 1
fi
log="${REPLOG_DOCKERD_LOG:-/var/log/replog-dockerd.log}"
nohup dockerd >"$log" 2>&1 </dev/null &
pid=$!
for _ in $(seq 120); do
  if docker info >/dev/null 2>&1; then
    echo "$pid"
    exit 0
  fi
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "dockerd exited at start; its log, $log, says:" >&2
    tail -20 "$log" >&2
    exit 1
  fi
  sleep 0.5
done
echo "dockerd did not answer within 60 s; see its log, $log" >&2
exit 1
