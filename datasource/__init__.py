"""Spark: the "replog" Python data source (reader and exactly-once writer)."""
