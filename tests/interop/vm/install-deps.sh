#!/bin/bash
# Debian 12 packages the Soft-RoCE VM needs on the host (run as root). Idempotent: when every package
# is already installed it only runs dpkg-query (well under a second) and never touches the network.
#
# - linux-image-amd64 is only a source of a vmlinuz and of rdma_rxe & friends for the guest; it is
#   installed with INITRD=No so that its postinst does not spend time building a host initrd.
# - ibverbs-utils / rdmacm-utils / perftest / ibverbs-providers are copied into the guest.
# - --no-install-recommends keeps the cold install small (about 55 packages instead of 200).
set -euo pipefail

PKGS=(qemu-system-x86 linux-image-amd64 ibverbs-utils ibverbs-providers rdmacm-utils perftest
      busybox-static iproute2 tcpdump cpio gzip kmod python3)

missing=()
for p in "${PKGS[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [ "$status" = "install ok installed" ] || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PKGS[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive INITRD=No
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
