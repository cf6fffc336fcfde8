"""Cluster metadata: the immutable image of one version (brokers, topics, leaders, ISRs) and the
store that keeps controller claims and versions on object storage, written put-if-absent."""
