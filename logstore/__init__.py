"""One replica's log of one partition, as immutable segment objects on fsspec storage."""
