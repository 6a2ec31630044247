#!/usr/bin/env bash
# softrdma to softrdma across two network namespaces joined by a veth pair, with no
# configuration: each program lists the devices of its namespace (lo and the veth) and rdma_cm
# picks the one that routes to the peer.
#
#   cargo build --release --examples && sudo tests/netns/run.sh
#
# Needs root (ip netns). Ends with "N passed, M failed"; exit status 1 if any failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
EX=${EX:-target/release/examples}
A=softrdma-ns-a-$$ B=softrdma-ns-b-$$
IPA=10.78.0.1 IPB=10.78.0.2
IP6A=fd78::1 IP6B=fd78::2
OUT=target/netns; mkdir -p "$OUT"

command -v ip >/dev/null || { apt-get install -y -qq iproute2 >/dev/null 2>&1 || apt-get update -qq && apt-get install -y -qq iproute2 >/dev/null; }

cleanup() { ip netns del "$A" 2>/dev/null; ip netns del "$B" 2>/dev/null; }
trap cleanup EXIT
ip netns add "$A" && ip netns add "$B" || exit 1
ip link add va type veth peer name vb || exit 1
ip link set va netns "$A" && ip link set vb netns "$B"
ip -n "$A" addr add $IPA/24 dev va && ip -n "$B" addr add $IPB/24 dev vb
# IPv6 too (nodad: usable at once); the veth's GID 2 is then its fd78:: address.
ip -n "$A" addr add $IP6A/64 dev va nodad && ip -n "$B" addr add $IP6B/64 dev vb nodad
for n in "$A" "$B"; do ip -n "$n" link set lo up; done
ip -n "$A" link set va up && ip -n "$B" link set vb up

pass=0 fail=0
# run NAME SERVER_CMD CLIENT_CMD ERE: the server in A, the client in B; both must exit 0 and the
# client's output must match ERE.
run() {
  local name=$1 srv=$2 cli=$3 ere=$4
  ip netns exec "$A" timeout 60 bash -c "$srv" >"$OUT/$name.server.log" 2>&1 & local sp=$!
  sleep 0.5
  local crc=1
  for _ in 1 2 3 4 5; do
    ip netns exec "$B" timeout 60 bash -c "$cli" >"$OUT/$name.client.log" 2>&1 && { crc=0; break; }
    sleep 0.5
  done
  wait $sp; local src=$?
  if [ $crc = 0 ] && [ $src = 0 ] && grep -Eq "$ere" "$OUT/$name.client.log"; then
    echo "PASS $name"; pass=$((pass + 1))
  else
    echo "FAIL $name (server $src, client $crc)"; tail -n 5 "$OUT/$name.server.log" "$OUT/$name.client.log"
    fail=$((fail + 1))
  fi
}

run rping "$EX/rping -s -v -S 5000" "$EX/rping -c -a $IPA -C 20 -V -v -S 5000" '^ping data: rdma-ping-19: '
run cmatose "$EX/cmatose -c 20 -C 50" "$EX/cmatose -s $IPA -c 20 -C 50" '^return status 0'
run udaddy "$EX/udaddy -c 4 -C 30" "$EX/udaddy -s $IPA -c 4 -C 30" '^return status 0'
run perftest-write-R "$EX/perftest write -R -n 500 -s 65536" "$EX/perftest write -R -n 500 -s 65536 $IPA" '^ *65536 +500 '
# rc_pingpong has no rdma_cm: like ibv_rc_pingpong it takes the first device, which is the veth
# (the loopback device is last), as a user would run it: no -d, no SOFTRDMA_ADDR.
run rc-pingpong "$EX/rc_pingpong -g 1 -n 200 -s 4096" "$EX/rc_pingpong -g 1 -n 200 -s 4096 $IPA" '^1638400 bytes in'

# Over IPv6: rdma_cm to an IPv6 address (the server bound to [::]), and rc_pingpong over GID 2.
run rping-v6 "$EX/rping -s -a :: -v -S 5000" "$EX/rping -c -a $IP6A -C 20 -V -v -S 5000" '^ping data: rdma-ping-19: '
run udaddy-v6 "$EX/udaddy -b :: -c 4 -C 30" "$EX/udaddy -s $IP6A -c 4 -C 30" '^return status 0'
run rc-pingpong-v6 "$EX/rc_pingpong -g 2 -n 200 -s 4096" "$EX/rc_pingpong -g 2 -n 200 -s 4096 $IPA" 'GID fd78::1$'

# Debian's unmodified programs on softrdma's libibverbs.so.1 / librdmacm.so.1 (capi/), across
# the namespaces: each opens the first device (the veth), as a user runs them.
CAPI=${CAPI:-target/release/softrdma}
if [ -x "$CAPI" ]; then
  run capi-rc-pingpong "$CAPI run -- ibv_rc_pingpong -g 0 -n 200 -s 4096" \
    "$CAPI run -- ibv_rc_pingpong -g 0 -n 200 -s 4096 $IPA" '^1638400 bytes in'
  run capi-uc-pingpong "$CAPI run -- ibv_uc_pingpong -g 0 -n 200 -s 4096" \
    "$CAPI run -- ibv_uc_pingpong -g 0 -n 200 -s 4096 $IPA" '^1638400 bytes in'
  run capi-ud-pingpong "$CAPI run -- ibv_ud_pingpong -g 0 -n 200 -s 1024" \
    "$CAPI run -- ibv_ud_pingpong -g 0 -n 200 -s 1024 $IPA" '^409600 bytes in'
  run capi-srq-pingpong "$CAPI run -- ibv_srq_pingpong -g 0 -n 100 -s 4096" \
    "$CAPI run -- ibv_srq_pingpong -g 0 -n 100 -s 4096 $IPA" '^819200 bytes in'
  # The device list of a namespace: the veth first (its IPv4 GID), the loopback device last.
  run capi-ibv-devinfo "true" \
    "$CAPI run -- ibv_devices && $CAPI run -- ibv_devinfo -v | grep GID" 'GID\[  0\]:[[:space:]]+::ffff:10\.78\.0\.2, RoCE v2'
  run capi-rping "$CAPI run -- rping -s -a $IPA -p 7310 -C 10 -V -v" \
    "$CAPI run -- rping -c -a $IPA -p 7310 -C 10 -V -v" '^ping data: rdma-ping-9: '
  run capi-ucmatose "$CAPI run -- ucmatose -c 4 -C 20" \
    "$CAPI run -- ucmatose -s $IPA -c 4 -C 20" '^return status 0'
  run capi-udaddy "$CAPI run -- udaddy -c 2 -C 10" \
    "$CAPI run -- udaddy -s $IPA -c 2 -C 10" '^return status 0'
  run capi-rdma-server-client "$CAPI run -- rdma_server -p 7311" \
    "$CAPI run -- rdma_client -s $IPA -p 7311" '^rdma_client: end 0'
  # cmtime's server never exits by itself: stopped once its client is surely done.
  run capi-cmtime "($CAPI run -- cmtime -b $IPA -p 7312 & p=\$!; sleep 6; kill \$p); true" \
    "$CAPI run -- cmtime -s $IPA -p 7312 -c 20" '^disconnect +: +[0-9.]+'
  # perftest, every test with its TCP exchange and with -R (rdma_cm), perftest's result line.
  for t in send write read atomic; do
    for k in bw lat; do
      case $t in atomic) sz=8 ;; *) sz=$([ $k = bw ] && echo 65536 || echo 2) ;; esac
      sarg=""; [ $t != atomic ] && sarg="-s $sz"
      for r in "" "-R"; do
        run "capi-ib-$t-$k${r:+-R}" "$CAPI run -- ib_${t}_$k $r -F -n 200 $sarg" \
          "$CAPI run -- ib_${t}_$k $r -F -n 200 $sarg $IPA" "^ *$sz +200 +[0-9.]+ +[0-9.]+"
      done
    done
  done
else
  echo "SKIP capi-* (build $CAPI: cargo build --release -p softrdma-capi)"
fi

# Several processes sharing one non-loopback address on each side (issue 8): three servers at
# once in A, their three clients at once in B, plus an rc_pingpong pair; every one must finish.
shared() {
  local pids=() rc=0 i
  ip netns exec "$A" timeout 60 "$EX/rping" -s -v -S 3000 -p 7301 >"$OUT/shared.rping.s.log" 2>&1 & pids+=($!)
  ip netns exec "$A" timeout 60 "$EX/cmatose" -p 7302 -c 4 -C 20 >"$OUT/shared.cmatose.s.log" 2>&1 & pids+=($!)
  ip netns exec "$A" timeout 60 "$EX/udaddy" -p 7303 -c 2 -C 10 >"$OUT/shared.udaddy.s.log" 2>&1 & pids+=($!)
  ip netns exec "$A" timeout 60 "$EX/rc_pingpong" -g 1 -p 18600 -n 100 >"$OUT/shared.pp.s.log" 2>&1 & pids+=($!)
  sleep 0.7
  ip netns exec "$B" timeout 60 "$EX/rping" -c -a $IPA -p 7301 -C 10 -V -v -S 3000 >"$OUT/shared.rping.c.log" 2>&1 & pids+=($!)
  ip netns exec "$B" timeout 60 "$EX/cmatose" -s $IPA -p 7302 -c 4 -C 20 >"$OUT/shared.cmatose.c.log" 2>&1 & pids+=($!)
  ip netns exec "$B" timeout 60 "$EX/udaddy" -s $IPA -p 7303 -c 2 -C 10 >"$OUT/shared.udaddy.c.log" 2>&1 & pids+=($!)
  ip netns exec "$B" timeout 60 "$EX/rc_pingpong" -g 1 -p 18600 -n 100 $IPA >"$OUT/shared.pp.c.log" 2>&1 & pids+=($!)
  for i in "${pids[@]}"; do wait "$i" || rc=1; done
  grep -q '^ping data: rdma-ping-9: ' "$OUT/shared.rping.c.log" || rc=1
  grep -q '^return status 0' "$OUT/shared.cmatose.c.log" || rc=1
  grep -q '^return status 0' "$OUT/shared.udaddy.c.log" || rc=1
  grep -q 'bytes in' "$OUT/shared.pp.c.log" || rc=1
  if [ $rc = 0 ]; then
    echo "PASS shared-address (4 servers on $IPA, 4 clients on $IPB, all at once)"; pass=$((pass + 1))
  else
    echo "FAIL shared-address"; tail -n 3 "$OUT"/shared.*.log; fail=$((fail + 1))
  fi
}
shared

echo "$pass passed, $fail failed"
[ $fail = 0 ]
