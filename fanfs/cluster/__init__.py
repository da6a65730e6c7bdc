"""Cluster mode: one mount daemon per node under mpirun/srun (docs/cluster.md).

`topology` is pure (placement, launch detection); `transport` is the only module that
imports mpi4py; `staging` copies this node's share of a pack to its cache dir; `remote`
fetches stored chunks from their owners for the read path; `node` wires it into a mount.
"""
