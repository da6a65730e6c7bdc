"""The on-disk pack format: manifest, index and partitions (docs/format.md).

Knows nothing of codecs' internals, FUSE, trio or MPI.
"""
