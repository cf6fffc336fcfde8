"""The cluster, in parts whose imports point one way (down this list):

- :mod:`replication.tools`: the ``replog`` CLI, local clusters, perf tools.
- :mod:`replication.server`: a node (broker, controller candidate, or both): its socket server
  and the request handlers (KafkaApis for brokers, ControllerApis for the controller).
- :mod:`replication.coordinator`: the transaction coordinator (on ``__transaction_state``).
- :mod:`replication.broker`: partitions and their replicas: ReplicaManager, Partition, the
  purgatories, producer state, replica fetchers, fetch sessions, the broker's lifecycle.
- :mod:`replication.controller`: the controller and its election on the metadata store.
- :mod:`replication.metadata`: the cluster metadata image and its store.
- :mod:`replication.client`: the Producer, Consumer and Admin (used by tools and Spark).
- :mod:`replication.protocol`: the wire protocol (codec, messages by API, framing, rpc).
- :mod:`replication.errors` and :mod:`replication.config`: the error tree and the broker's
  configuration, used by all of the above.
"""

from logstore._distribution import check_installation

check_installation()
