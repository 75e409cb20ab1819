#!/bin/sh
# Install what `san-hil lab` needs on a fresh Debian/Ubuntu machine. Run as root, from the project:
#   sh hil/lab/install.sh
# qemu and the RDMA user space on the host (the guests share the host's root filesystem, so the host's
# python3, pyverbs, rdma, perftest and nvme-cli are what runs inside them; virtme-ng needs busybox-static for
# its initramfs), sshd for the guests, what `lab up --provider siw` builds siw.ko with (the kernel headers
# and source of the lab kernel's exact Debian version, make, gcc, xz; for `--kernel 6.12`, mmdebstrap, which
# makes the Debian 13 build root siw.ko is built in), then the project's `lab` extra (virtme-ng, pyroute2) with
# the pip of the Python that runs san-hil.
# Running it again installs nothing new.
set -eu
if [ "$(id -u)" != 0 ]; then
    echo "install.sh: run as root (apt-get install)" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y qemu-system-x86 rdma-core ibverbs-providers ibverbs-utils python3-pyverbs kmod nvme-cli \
    openssh-server perftest iproute2 python3-pyroute2 busybox-static make gcc xz-utils mmdebstrap

# siw: the lab boots the image package linux-image-amd64 depends on (hil/lab/kernel.py), at apt's
# candidate version; siw.ko is built against that kernel's headers and source at exactly that version.
IMAGE=$(apt-cache depends linux-image-amd64 2>/dev/null \
    | sed -n 's/^ *|\{0,1\}Depends: \(linux-image-[^ ]*\)$/\1/p' | grep -vx linux-image-amd64 | head -n 1 || true)
VERSION=$([ -n "$IMAGE" ] && apt-cache show --no-all-versions "$IMAGE" 2>/dev/null | sed -n 's/^Version: //p' \
    | head -n 1 || true)
if [ -z "$IMAGE" ] || [ -z "$VERSION" ]; then
    echo "install.sh: apt names no Debian kernel image (linux-image-amd64): the siw build's headers and source" \
         "are not installed (rxe labs do not need them)" >&2
else
    RELEASE=${IMAGE#linux-image-}             # 6.1.0-57-amd64
    SERIES=$(echo "$VERSION" | cut -d. -f1,2) # 6.1.192-3 -> 6.1
    WANT="linux-headers-$RELEASE linux-source-$SERIES"
    MISSING=""
    for package in $WANT; do
        if [ "$(dpkg-query -W -f '${Status} ${Version}' "$package" 2>/dev/null)" != "install ok installed $VERSION" ]; then
            MISSING="$MISSING $package=$VERSION"
        fi
    done
    if [ -n "$MISSING" ]; then
        # Only siw labs need these: if apt no longer has this exact version, say so and go on (rxe labs work,
        # and `lab up --provider siw` names what is missing).
        # shellcheck disable=SC2086 # one word per package
        apt-get install -y --no-install-recommends --allow-downgrades $MISSING \
            || echo "install.sh: could not install$MISSING: siw labs cannot build siw.ko until they are" >&2
    else
        echo "install.sh: $WANT $VERSION already installed (for siw.ko)"
    fi
fi

PYTHON=${PYTHON:-python3}
"$PYTHON" -m pip install virtme-ng pyroute2
echo "install.sh: done; next: san-hil lab up --hosts 2 (or --provider siw)"
