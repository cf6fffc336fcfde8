"""Security, as Kafka's: encrypted connections (TLS), authenticated principals (SASL SCRAM and
PLAIN, or the client certificate) and authorization (ACLs evaluated on every request).

- :mod:`.config`: the broker's security keys (Kafka's names), parsed with the broker config.
- :mod:`.principal`: who a connection is (``User:alice``), in a context variable the request
  handlers read.
- :mod:`.acl`: resources, operations and ACL bindings.
- :mod:`.authorizer`: what decides; Kafka's StandardAuthorizer over the ACLs in the metadata.
- :mod:`.scram`: SCRAM credentials, stored salted and hashed in the metadata.

Everything is off by default: a listener is PLAINTEXT unless listener.security.protocol.map
says otherwise, and no authorizer runs unless authorizer.class.name names one.
"""
