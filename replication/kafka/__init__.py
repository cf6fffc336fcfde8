"""The Kafka listener: Kafka's own wire protocol and record format on a replog broker."""
