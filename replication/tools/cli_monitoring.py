"""``replog cluster prometheus-config``: a Prometheus config for the nodes of a local cluster.

    replog cluster up --detach                  # each node serves /metrics (--metrics-port-base)
    replog cluster prometheus-config            # writes <data>/prometheus.yml
    prometheus --config.file=replog-data/prometheus.yml

The config has the shape of conf/docker/prometheus/prometheus.yml (the same jobs), so the
Grafana dashboard in conf/docker/grafana/dashboards/ reads a local cluster as it reads the
Docker one. The CLI registers :func:`cluster_prometheus_config` under ``replog cluster``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from replication.tools.prometheus_config import render

if TYPE_CHECKING:
    # local_cluster brings the node (a broker's whole import): every CLI command would pay for
    # it at start, so it is imported where a command uses it
    from replication.tools.local_cluster import ClusterLayout

__all__ = ["cluster_prometheus_config", "local_targets"]


def local_targets(layout: ClusterLayout) -> dict[str, list[str]]:
    """Prometheus job -> the metrics endpoints of the cluster's nodes (as ``cluster up``
    recorded them in its state file)."""
    from replication.tools.local_cluster import ClusterError

    try:
        doc = json.loads(layout.state_path.read_text())
    except FileNotFoundError:
        raise ClusterError(
            f"no cluster was started with --data {layout.data} (no {layout.state_path}); "
            "start one with `replog cluster up [--data DIR]`"
        ) from None
    targets: dict[str, list[str]] = {}
    for node in doc["nodes"]:
        port = int(node.get("metrics_port", 0))
        if port > 0:
            targets.setdefault(f"replog-{node['role']}", []).append(f"127.0.0.1:{port}")
    if not targets:
        raise ClusterError(
            f"no node of the cluster on --data {layout.data} serves metrics: start it with a "
            "metrics port, `replog cluster up --metrics-port-base 9404` (broker i on 9404+i, "
            "the controller after the brokers)"
        )
    return targets


def cluster_prometheus_config(
    data: Annotated[
        str,
        typer.Option("--data", help="the --data the cluster was started with"),
    ] = "replog-data",
    output: Annotated[
        str | None,
        typer.Option(
            "--output",
            help="where to write it (default: prometheus.yml beside the "
            "cluster's state, in the data directory)",
        ),
    ] = None,
    rules: Annotated[
        list[str] | None,
        typer.Option(
            "--rules",
            help="an alerting rules file to load (e.g. conf/docker/prometheus/alerts.yml)",
        ),
    ] = None,
) -> None:
    """Write a Prometheus config that scrapes every node of the local cluster."""
    from replication.tools.local_cluster import ClusterError, ClusterLayout

    layout = ClusterLayout.of(data)
    targets = local_targets(layout)
    path = Path(output) if output else layout.run_dir / "prometheus.yml"
    rule_files = [str(Path(r).resolve()) for r in rules or []]
    for rule_file in rule_files:
        if not Path(rule_file).exists():
            raise ClusterError(f"--rules {rule_file}: no such file")
    path.write_text(
        render(
            targets,
            rule_files=rule_files,
            header=f"replog cluster on {layout.data}: written by replog cluster prometheus-config",
        )
    )
    count = sum(len(t) for t in targets.values())
    typer.echo(f"wrote {path} ({count} targets); run: prometheus --config.file={path}")
