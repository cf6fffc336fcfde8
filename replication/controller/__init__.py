"""The controller (the one writer of cluster metadata) and the service that elects it through
put-if-absent claims on the metadata store."""
