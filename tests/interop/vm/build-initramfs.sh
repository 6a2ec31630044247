#!/bin/bash
# Build the Soft-RoCE guest: an initramfs with busybox, the Debian kernel's Soft-RoCE stack
# (rdma_rxe, rdma_cm, uverbs), rdma-core's user libraries and reference tools (rping, ibv_*_pingpong,
# perftest), iproute2 and tcpdump; plus the matching kernel image.
# Usage: build-initramfs.sh OUT      writes OUT/initramfs.cpio.gz, OUT/vmlinuz, OUT/kernel-version
# Needs the packages of install-deps.sh. Takes a few seconds; run.sh caches the result.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${1:?usage: build-initramfs.sh OUT}
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)

# The newest kernel that has both an image and modules (the host may run a different kernel).
KV=
for d in $(find /lib/modules -mindepth 1 -maxdepth 1 -printf '%f\n' 2>/dev/null | sort -V); do
  [ -e "/boot/vmlinuz-$d" ] && [ -e "/lib/modules/$d/modules.dep" ] && KV=$d
done
[ -n "$KV" ] || { echo "build-initramfs: no kernel with /boot/vmlinuz-* and modules (install linux-image-amd64)" >&2; exit 1; }

R=$OUT/root
rm -rf "$R"; mkdir -p "$R"/{bin,sbin,proc,sys,dev,tmp,etc,host,run} "$R/lib/modules/$KV"
cp /bin/busybox "$R/bin/busybox"

# Kernel modules and their dependencies. crc32_generic is needed by rdma_rxe for the ICRC.
mods="sch_netem virtio_net crc32_generic rdma_rxe rdma_ucm ib_uverbs ib_umad veth dummy 9p 9pnet
 9pnet_virtio virtio_pci netfs fscache"
for m in $mods; do
  line=$(grep -E "/$m\.ko(\.xz)?:" "/lib/modules/$KV/modules.dep" | head -1) || { echo "no module $m (built in?)" >&2; continue; }
  for f in ${line%%:*} ${line#*:}; do
    mkdir -p "$(dirname "$R/lib/modules/$KV/$f")"; cp "/lib/modules/$KV/$f" "$R/lib/modules/$KV/$f"
  done
done
for f in modules.dep modules.order modules.builtin modules.alias modules.symbols; do
  [ -e "/lib/modules/$KV/$f" ] && cp "/lib/modules/$KV/$f" "$R/lib/modules/$KV/"
done

# User-space tools, the rxe provider, and every library they load.
bins="/usr/bin/rping /usr/bin/ucmatose /usr/bin/udaddy /usr/bin/ibv_devices /usr/bin/ibv_devinfo
 /usr/bin/ibv_rc_pingpong /usr/bin/ibv_ud_pingpong /usr/bin/ibv_uc_pingpong /usr/bin/ibv_srq_pingpong
 /usr/bin/ib_send_bw /usr/bin/ib_send_lat /usr/bin/ib_write_bw /usr/bin/ib_write_lat /usr/bin/ib_read_bw
 /usr/bin/ib_read_lat /usr/bin/ib_atomic_bw /usr/bin/ib_atomic_lat /usr/bin/rdma_server /usr/bin/rdma_client
 /usr/bin/rdma_xserver /usr/bin/rdma_xclient /usr/bin/rdma /usr/sbin/ip /usr/sbin/tc /usr/bin/ss /usr/bin/tcpdump"
provider=$(find /usr/lib/x86_64-linux-gnu/libibverbs -name 'librxe-rdmav*.so' | head -1)
[ -n "$provider" ] || { echo "build-initramfs: no rxe provider (install ibverbs-providers)" >&2; exit 1; }
present=()
for b in $bins; do
  if [ -e "$b" ]; then present+=("$b"); else echo "build-initramfs: missing $b (skipped)" >&2; fi
done
for b in "${present[@]}"; do mkdir -p "$R$(dirname "$b")"; cp "$b" "$R$b"; done
# stdbuf's preload library: the guest runs its tools line-buffered, so that a tool killed by a
# timeout still leaves its output in the log.
stdbuf_lib=/usr/libexec/coreutils/libstdbuf.so
if [ -e "$stdbuf_lib" ]; then present+=("$stdbuf_lib"); fi
mkdir -p "$R$(dirname "$provider")" "$R/etc/libibverbs.d"
cp "$provider" "$R$provider"
cp /etc/libibverbs.d/rxe.driver "$R/etc/libibverbs.d/"
# ldd prints "name => /path (addr)" or "/path (addr)": keep the absolute paths.
for f in "${present[@]}" "$provider" /lib/x86_64-linux-gnu/libgcc_s.so.1; do
  echo "$f"; ldd "$f" 2>/dev/null | grep -o '/[^ ]*' || true
done | sort -u | while read -r l; do
  mkdir -p "$R$(dirname "$l")"; cp -L "$l" "$R$l"
done
mkdir -p "$R/lib64"; cp -L /lib64/ld-linux-x86-64.so.2 "$R/lib64/"

cp "$HERE/init" "$R/init"; chmod +x "$R/init"
(cd "$R" && find . | cpio -o -H newc 2>/dev/null | gzip -1 > "$OUT/initramfs.cpio.gz.tmp")
mv "$OUT/initramfs.cpio.gz.tmp" "$OUT/initramfs.cpio.gz"
cp "/boot/vmlinuz-$KV" "$OUT/vmlinuz"
echo "$KV" > "$OUT/kernel-version"
rm -rf "$R"
echo "build-initramfs: $OUT/initramfs.cpio.gz ($(du -h "$OUT/initramfs.cpio.gz" | cut -f1)), kernel $KV"
