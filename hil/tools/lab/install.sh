#!/bin/sh
# Install what `san-hil lab` needs on a fresh Debian/Ubuntu machine. Run as root, from the project:
#   sh hil/tools/lab/install.sh
# qemu and the RDMA user space on the host (the guests share the host's root filesystem, so the host's
# python3, pyverbs, rdma and perftest are what runs inside them; virtme-ng needs busybox-static for its
# initramfs), sshd for the guests, then the
# project's `lab` extra (virtme-ng, pyroute2) with the pip of the Python that runs san-hil.
set -eu
if [ "$(id -u)" != 0 ]; then
    echo "install.sh: run as root (apt-get install)" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y qemu-system-x86 rdma-core ibverbs-providers ibverbs-utils python3-pyverbs kmod \
    openssh-server perftest iproute2 python3-pyroute2 busybox-static
PYTHON=${PYTHON:-python3}
"$PYTHON" -m pip install virtme-ng pyroute2
echo "install.sh: done; next: san-hil lab up --hosts 2"
