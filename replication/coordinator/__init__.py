"""Coordinators that keep their state on internal replicated topics: the transaction coordinator
(``__transaction_state``)."""
