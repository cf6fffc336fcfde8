"""A Prometheus scrape config for replog's nodes: the one in ``conf/docker/prometheus/`` (nodes
by service name) and one for a local cluster (``replog cluster prometheus-config``: nodes on
127.0.0.1), in the same shape, so the Grafana dashboard in ``conf/docker/grafana/`` reads
either.

Two jobs: ``replog-broker`` (every broker; with process.roles=broker,controller also a
controller candidate) and ``replog-controller`` (the standalone controllers). Each node's
``metrics.port`` serves http://HOST:PORT/metrics.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

#: how often Prometheus scrapes (the dashboard's rates take 4 scrapes: rate(...[1m]))
SCRAPE_INTERVAL = "15s"
JOBS = ("replog-broker", "replog-controller")


def render(
    targets: Mapping[str, Sequence[str]], *, rule_files: Sequence[str] = (), header: str = ""
) -> str:
    """prometheus.yml scraping ``targets`` (job -> ["host:port", ...]) every SCRAPE_INTERVAL,
    with alerting rules from ``rule_files`` (paths as Prometheus sees them)."""
    unknown = set(targets) - set(JOBS)
    if unknown:
        raise ValueError(f"unknown jobs {sorted(unknown)}; replog's jobs are {JOBS}")
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    lines += [
        "global:",
        f"  scrape_interval: {SCRAPE_INTERVAL}",
        f"  evaluation_interval: {SCRAPE_INTERVAL}",
    ]
    if rule_files:
        lines += ["rule_files:", *(f'  - "{path}"' for path in rule_files)]
    lines.append("scrape_configs:")
    for job in JOBS:
        if not targets.get(job):
            continue
        lines += [
            f"  - job_name: {job}",
            "    metrics_path: /metrics",
            "    static_configs:",
            "      - targets:",
            *(f'          - "{target}"' for target in targets[job]),
        ]
    return "\n".join(lines) + "\n"
