"""A replog node (Kafka's KafkaRaftServer): the socket server, and the handlers of broker APIs
(:class:`~replication.server.apis.KafkaApis`) and controller APIs
(:class:`~replication.server.controller_apis.ControllerApis`), wired to the broker, controller
and coordinator parts by :mod:`replication.server.node`."""
