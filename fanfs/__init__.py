"""fanfs: a compressed, partitioned, read-only FUSE filesystem for deep-learning datasets.

Importing this package is cheap and side-effect free: it never imports pyfuse3, trio or
mpi4py. The layers are described in docs/architecture.md.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
