"""A partition replica's log on object storage (local files, S3, memory, through fsspec).

Two layouts, one log model (:class:`logstore.log.Log`: an ordered list of extents, each a
byte range of an object holding whole, CRC-checked record batches):

* **Standalone** (``log.wal.enable=false``, tools, tests): each partition log writes its own
  *segment objects* ``<topic>/<partition>/<base offset>.seg``, one per group-committed flush,
  merged later into bigger ones (:mod:`logstore.log`; the extents and reads:
  :mod:`logstore.local_log`; retention and merging: :mod:`logstore.log_retention`).
* **Over the broker WAL** (``log.wal.enable=true``): one :class:`~logstore.wal.WalWriter` per
  broker root writes every dirty partition's batches into *one* object per flush,
  ``_replog/wal/L0/<seq>-<broker epoch>.wal`` (format: :mod:`logstore.wal_format`: a header,
  one CRC'd chunk per partition, a CRC'd footer index). On S3 a PUT is priced per request, so
  the request rate must follow the broker's flushes, not its partition count. A partition's
  durable end moves only once the object holding its chunk is written, so acks=all keeps its
  meaning (durable in every ISR member's own store). The :class:`~logstore.compaction.
  Compactor` rewrites old L0 objects into packed L1 objects (every byte read once, request
  count independent of partitions) and deletes objects nobody refers to after
  ``file.delete.delay.ms``, never the newest one (seqs continue from it across restarts).

Recovery trusts only what a checkpoint or a valid scan says: :meth:`WalIndex.load
<logstore.wal_index.WalIndex.load>` lists ``_replog/wal/`` once and reads each object's footer
(scanning an object whose footer does not check to its whole-batch prefix); each log then
(:mod:`logstore.log_loader`) walks its segment objects and its chunks together in offset
order (covered copies skipped, a gap ends the log), voiding chunks its checkpoint's
truncation records or ``wal_start_seq`` disown (truncation cannot cut a shared object, so it
is recorded instead). High watermarks
of logs over the WAL live in one broker checkpoint (``_replog/checkpoint.json``), not in a
checkpoint per partition. Only whole CRC-valid batches are ever served, from memory or from
any object. ``replog log dump`` reads every kind of object.
"""

from logstore._distribution import check_installation

check_installation()
