"""Become one node of the test cluster, then exec its slurmd (integration/test_slurm.py).

    unshare --uts --mount --propagation slave -- python node.py NAME HOSTS LOCAL SLURM_CONF

Runs as the first process of a fresh UTS and mount namespace, as root:
1. takes NAME as hostname;
2. detaches its copies of the host's FUSE and loop-device mounts. A new mount namespace
   starts with a copy of every mount of the host, and a copy keeps a FUSE connection alive:
   a mount someone made before this node started would then never end when they unmount
   it on the host (the daemon waits for a connection that this namespace still holds).
   Slave propagation passes later host unmounts on only where the host's mounts are shared
   (systemd's default); on hosts whose mounts are private, as on the test machines, it
   passes nothing, hence this step. Unmounts here never propagate back to the host;
3. bind-mounts HOSTS over /etc/hosts (node names -> 127.0.0.x) and a private tmpfs on LOCAL,
   the node-local disk;
4. execs `slurmd -D -N NAME -f SLURM_CONF`, so this process is the node's slurmd.
"""

from __future__ import annotations

import os
import subprocess
import sys

from fanfs.mountinfo import mounts


def _run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, stdin=subprocess.DEVNULL)


def main(argv: list[str]) -> int:
    name, hosts, local, conf = argv[1:5]
    with open("/proc/sys/kernel/hostname", "w") as f:
        f.write(name)
    copied = [
        entry.mountpoint
        for entry in mounts()
        if entry.fstype.startswith("fuse") or entry.source.startswith("/dev/loop")
    ]
    for mountpoint in reversed(copied):  # the deepest, most recent first
        subprocess.run(["umount", "-l", mountpoint], check=False, capture_output=True)
    _run("mount", "--bind", hosts, "/etc/hosts")
    _run("mount", "-t", "tmpfs", "-o", "size=2g,mode=0755", "fanfs-local-" + name, local)
    os.execvp("slurmd", ["slurmd", "-D", "-N", name, "-f", conf])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
