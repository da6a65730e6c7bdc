"""The fanfs exception hierarchy.

Every class carries the errno a FUSE reader gets (`fuse_errno`) and the exit code a command
returns (`exit_code`); docs/errors.md lists them. Lower layers raise these with context and
never log; the FUSE boundary (operations.py) and the CLI (cli.py) translate and log once.
"""

from __future__ import annotations

import errno


class FanfsError(Exception):
    """Base class. Unexpected internal failures map to EIO and exit code 1."""

    fuse_errno: int = errno.EIO
    exit_code: int = 1


class UsageError(FanfsError):
    """Bad command line, configuration or input the user can fix."""

    exit_code = 2


class PackInputError(UsageError):
    """The source tree given to `fanfs pack` cannot be packed as it is."""


class CorruptDataError(FanfsError):
    """Stored bytes do not decode to what the index promises."""

    exit_code = 3


class ChecksumError(CorruptDataError):
    """A stored object's checksum does not match."""


class DecompressionError(CorruptDataError):
    """A codec rejected a stored object, or it decoded to the wrong size."""


class KnownCorruptError(CorruptDataError):
    """Corrupt data that was already reported (logged) once for this mount."""


class PackFormatError(CorruptDataError):
    """A pack is missing, truncated, or not a fanfs pack."""


class PackVersionError(PackFormatError):
    """A pack was written with a format version this fanfs cannot read."""


class RemoteReadError(FanfsError):
    """No owner of a partition answered and the pack could not be read either."""


class MountClosingError(RemoteReadError):
    """A read that was waiting for a peer when the mount began to shut down."""


class MountSetupError(FanfsError):
    """The mount cannot be set up: bad mountpoint, FUSE unavailable, ..."""

    exit_code = 4


class ClusterInitError(FanfsError):
    """MPI or cluster start-up failed."""

    exit_code = 5
