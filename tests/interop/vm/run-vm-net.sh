#!/bin/bash
# Boot the Soft-RoCE guest with its eth0 on tap0 inside network namespace NS, so that a program run
# on the host with `ip netns exec NS ...` talks to the guest's kernel RDMA stack. SHARE is /host in
# the guest, which runs /host/run.sh and powers off. The console goes to stdout.
# Host side: 10.77.0.1/24 on tap0 (MTU 9000). The guest configures its own eth0 in run.sh, e.g.
#   /usr/sbin/ip addr add 10.77.0.2/24 dev eth0; /usr/sbin/ip link set eth0 mtu 9000 up
#   rdma link add rxe0 type rxe netdev eth0
# If NS does not exist it is created and removed again on exit; an existing NS (run.sh makes its
# own) is used as it is and left alone.
# Usage: run-vm-net.sh SHARE   env: NS (default softrdma-vm), CACHE (default target/rxe-vm),
#        VM_TIMEOUT (s, default 900), VM_CPUS (2), VM_MEM (MiB, 1024)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
SHARE=$(cd "${1:?usage: run-vm-net.sh SHARE}" && pwd)
NS=${NS:-softrdma-vm}
CACHE=${CACHE:-$HERE/../../../target/rxe-vm}
[ -s "$CACHE/initramfs.cpio.gz" ] || { echo "run-vm-net: no $CACHE/initramfs.cpio.gz (vm/build-initramfs.sh)" >&2; exit 2; }

qemu=(timeout "${VM_TIMEOUT:-900}" qemu-system-x86_64 -accel "tcg,thread=multi" -cpu max
  -smp "${VM_CPUS:-2}" -m "${VM_MEM:-1024}" -kernel "$CACHE/vmlinuz" -initrd "$CACHE/initramfs.cpio.gz"
  -append "console=ttyS0 quiet panic=-1"
  -virtfs "local,path=$SHARE,mount_tag=host,security_model=none,id=host"
  -netdev "tap,id=n0,ifname=tap0,script=no,downscript=no"
  -device "virtio-net-pci,netdev=n0,mac=52:54:00:00:00:02"
  -nographic -no-reboot)

if ip netns pids "$NS" >/dev/null 2>&1; then
  exec ip netns exec "$NS" "${qemu[@]}" < /dev/null
fi
trap 'ip netns del "$NS" 2>/dev/null || true' EXIT
ip netns add "$NS"
ip -n "$NS" link set lo up
ip -n "$NS" tuntap add dev tap0 mode tap
ip -n "$NS" link set tap0 mtu 9000
ip -n "$NS" addr add 10.77.0.1/24 dev tap0
ip -n "$NS" link set tap0 up
ip netns exec "$NS" "${qemu[@]}" < /dev/null
