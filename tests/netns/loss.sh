#!/usr/bin/env bash
# RC WRITE throughput across two network namespaces joined by a veth pair, lossless and with
# a share of the packets dropped each way (docs/performance.md, "Loss"): perftest's
# ib_write_bw (examples/perftest, rdma_cm) server in A, client in B.
#
#   cargo build --release --examples && sudo tests/netns/loss.sh
#   LOSSES="0 2" MTU=9000 RUNS=3 ITERS=3000 SIZE=65536 sudo tests/netns/loss.sh
#   PERFTEST=path/to/perftest sudo tests/netns/loss.sh      # another build (before/after)
#
# The loss: `tc qdisc ... netem loss 2%` on both veth ends when the kernel has netem
# (LOSS_BY=netem); otherwise (LOSS_BY=nft, the default when netem is missing) an nftables
# netdev-ingress rule on each end drops that share of the IPv4 packets at random, with UDP
# segmentation offload and GRO off on the veths so that each RoCE packet is dropped on its own
# (a GSO batch crosses a veth as one skb). The drops counted are printed per run.
#
# Needs root (ip netns; tc or nft). Prints one line per run: loss, MTU, MB/s, drops; a
# benchmark, asserts nothing but that each run completes.
set -uo pipefail
cd "$(dirname "$0")/../.."
PERFTEST=${PERFTEST:-target/release/examples/perftest}
LOSSES=${LOSSES:-"0 2"}
MTU=${MTU:-9000}
RUNS=${RUNS:-3}
ITERS=${ITERS:-3000}
SIZE=${SIZE:-65536}
A=softrdma-loss-a-$$ B=softrdma-loss-b-$$
IPA=10.79.0.1 IPB=10.79.0.2
OUT=target/netns; mkdir -p "$OUT"

need() { command -v "$1" >/dev/null || { apt-get install -y -qq "$2" >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq "$2" >/dev/null; }; }; }
need tc iproute2
modprobe sch_netem 2>/dev/null || true
if [ -z "${LOSS_BY:-}" ]; then
  if tc qdisc add dev lo root netem loss 0% 2>/dev/null; then
    tc qdisc del dev lo root; LOSS_BY=netem
  else
    LOSS_BY=nft
  fi
fi
[ "$LOSS_BY" = nft ] && { need nft nftables; need ethtool ethtool; }

cleanup() { ip netns del "$A" 2>/dev/null; ip netns del "$B" 2>/dev/null; }
trap cleanup EXIT
ip netns add "$A" && ip netns add "$B" || exit 1
ip link add la type veth peer name lb || exit 1
ip link set la netns "$A" && ip link set lb netns "$B"
ip -n "$A" link set la mtu "$MTU" && ip -n "$B" link set lb mtu "$MTU"
ip -n "$A" addr add $IPA/24 dev la && ip -n "$B" addr add $IPB/24 dev lb
for n in "$A" "$B"; do ip -n "$n" link set lo up; done
ip -n "$A" link set la up && ip -n "$B" link set lb up

fail=0
port=19000
# set_loss NS DEV PERCENT
set_loss() {
  if [ "$LOSS_BY" = netem ]; then
    ip netns exec "$1" tc qdisc replace dev "$2" root netem loss "$3%"
  else
    [ -n "${KEEP_OFFLOAD:-}" ] || ip netns exec "$1" ethtool -K "$2" ${OFFLOAD_OFF:-tx-udp-segmentation off gro off} >/dev/null 2>&1
    local per10k; per10k=$(awk -v p="$3" 'BEGIN { printf "%d", p * 100 + 0.5 }')
    ip netns exec "$1" nft -f - <<NFT
table netdev loss
delete table netdev loss
table netdev loss {
  chain in {
    type filter hook ingress device $2 priority 0;
    meta protocol ip counter numgen random mod 10000 < $per10k counter drop
  }
}
NFT
  fi
}
# drops NS: "dropped/seen" IPv4 packets on NS's ingress since the rule was set (nft only)
drops() {
  [ "$LOSS_BY" = nft ] || { echo "netem"; return; }
  ip netns exec "$1" nft list table netdev loss | awk '/counter/ { n = 0; for (i = 1; i <= NF; i++) if ($i == "packets") c[++k] = $(i + 1) } END { printf "%d/%d", c[2], c[1] }'
}
# rcvbuf NS: UDP datagrams the kernel dropped for a full socket buffer in NS, so far
rcvbuf() { ip netns exec "$1" awk '/^Udp:/ { if (!h) { for (i = 1; i <= NF; i++) f[$i] = i; h = 1 } else print $f["RcvbufErrors"] }' /proc/net/snmp; }
for loss in $LOSSES; do
  set_loss "$A" la "$loss" || exit 1
  set_loss "$B" lb "$loss" || exit 1
  for run in $(seq 1 "$RUNS"); do
    port=$((port + 1))
    ip netns exec "$A" timeout 120 "$PERFTEST" write -R -p $port -n "$ITERS" -s "$SIZE" \
      >"$OUT/loss.server.log" 2>&1 & sp=$!
    sleep 0.5
    ip netns exec "$B" timeout 120 "$PERFTEST" write -R -p $port -n "$ITERS" -s "$SIZE" $IPA \
      >"$OUT/loss.client.log" 2>&1; crc=$?
    wait $sp; src=$?
    bw=$(awk -v s="$SIZE" '$1 == s && NF >= 4 { print $4 }' "$OUT/loss.client.log")
    if [ $crc = 0 ] && [ $src = 0 ] && [ -n "$bw" ]; then
      echo "loss $loss% mtu $MTU run $run: $bw MB/s (dropped at A $(drops "$A"), at B $(drops "$B"); rcvbuf drops A $(rcvbuf "$A") B $(rcvbuf "$B"))"
    else
      echo "loss $loss% mtu $MTU run $run: FAILED (server $src, client $crc)"
      tail -n 5 "$OUT/loss.server.log" "$OUT/loss.client.log"
      fail=$((fail + 1))
    fi
  done
done
[ $fail = 0 ]
