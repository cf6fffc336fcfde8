"""The cluster: wire protocol, broker, replication, controller, transactions, client and CLI."""
