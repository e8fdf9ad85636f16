"""Training text from shards: what ``task.data_path`` names, this node's share of it, read in bounded memory.

- ``sources``  the shards a path or index names: files, byte ranges, row ranges, URLs
- ``remote``   shards at URLs: cached, checked against their sha256, size-capped, retried
- ``object_store``  objects in s3://, gs://, hf://... stores, opened through fsspec for ``remote``
- ``compressed``  gzip and zstd shards: decompressed once into a capped plain copy in the cache
- ``guarded_http``  the GETs behind it: redirects over http(s) only, every connection checked first
- ``addresses``  which addresses a download may reach (public, private, loopback, link-local)
- ``readers``  one block of a shard: plain text, JSONL records (each decoded inside a guard), Parquet rows
- ``blocks``   what reading a block gives: its text, and the records and shards skipped
- ``parquet``  Parquet rows within a byte budget; ``parquet_pages``: the page headers that set it
- ``assign``   which peer reads which shard (rendezvous hashing, reshuffled each pass)
- ``stream``   this node's endless, resumable walk over its shards
- ``corpus``   the held-out split and its fixed validation windows
- ``text``     from the ``[task]`` settings to the stream and the validation batches

Every byte here comes from outside: bounded before it is parsed.  May import: torch, pyarrow,
:mod:`p2ptrain.config`, fsspec (only ``object_store``, deferred).
"""
