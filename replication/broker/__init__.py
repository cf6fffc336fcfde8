"""A broker's partitions (Kafka's ReplicaManager, Partition, purgatories, producer state),
replication between brokers (ReplicaFetcher, the leader's side of fetch sessions and the
fetcher's side, FetchSessionHandler), and the broker's lifecycle towards the controller."""
