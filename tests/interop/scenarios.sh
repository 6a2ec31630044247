# shellcheck shell=bash disable=SC2016  # snippets are expanded later, in the guest or on the host
# Interop scenarios: sourced by run.sh (bash). Each `scenario` call registers one; they run in this
# order, in one boot of the guest. See README.md for the fields; in short:
#
#   scenario NAME role=guest-only|host-server|host-client [key=value ...]
#     desc=TEXT          one line for the report
#     needs=BIN...       host binaries (a bare name means $EX/NAME); missing => SKIP, not run at all
#     guest=SNIPPET      busybox sh run in the guest (helpers: ready, wait_listen, until_host_done,
#                        host_done; variables: HOST_IP GUEST_IP SCEN_DIR)
#     host=COMMAND       bash run on the host inside the netns (variables: EX HOST_IP GUEST_IP OUT
#                        SCEN_DIR INTEROP_DIR); host-server starts it before the guest snippet,
#                        host-client after the snippet has called `ready`
#     host_ready=CHECK   host-server only: bash condition polled until true before the guest is let
#                        go (helpers: host_listening PORT, host_log_has REGEX); default: sleep 1
#     timeout=SECS       for each side (default 120; the guest is ~50-100x slower than the host)
#     grace=SECS         the guest snippet is killed this long after the host command finished
#                        (default 20), so a host side that failed early does not cost the timeout
#     guest_rc=N|any     expected exit status of the guest snippet (default 0)
#     host_rc=N|any      expected exit status of the host command (default 0)
#     expect_guest=ERE   must match a line of the guest's output (repeat the key for several)
#     expect_host=ERE    must match a line of the host's output (repeat the key for several)
#     check=COMMAND      extra bash check on the host after both sides finished; must exit 0
#
# The guest is 10.77.0.2 with rxe0 on eth0 (MTU 9000, so active path MTU 4096); the host side of the
# tap is 10.77.0.1 in a private network namespace.

# --- Kernel-only sanity: no softrdma involved; proves the VM, the share and the tap work. --------

scenario kernel-rxe-device role=guest-only \
  desc="rxe0 is up on eth0 and GID index 1 is the IPv4 address (what -g 1 selects)" \
  guest='ibv_devinfo -d rxe0; echo "gid1 $(cat /sys/class/infiniband/rxe0/ports/1/gids/1)"' \
  expect_guest='state:[[:space:]]+PORT_ACTIVE' \
  expect_guest='gid1 0000:0000:0000:0000:0000:ffff:0a4d:0002'

scenario kernel-rc-pingpong-loopback role=guest-only \
  desc="kernel ibv_rc_pingpong server and client, both in the guest on 10.77.0.2" \
  guest='ibv_rc_pingpong -d rxe0 -g 1 -n 100 -s 4096 & srv=$!
         wait_listen 18515
         ibv_rc_pingpong -d rxe0 -g 1 -n 100 -s 4096 $GUEST_IP && wait $srv' \
  expect_guest='^819200 bytes in [0-9.]+ seconds'

scenario kernel-rping-loopback role=guest-only \
  desc="kernel rping (rdma_cm, SEND/READ/WRITE) server and client, both in the guest" \
  guest='rping -s -a $GUEST_IP -C 3 -v -S 64 & srv=$!
         for i in 1 2 3 4 5; do sleep 2; rping -c -a $GUEST_IP -C 3 -v -S 64 && break; done && wait $srv' \
  expect_guest='ping data: rdma-ping-2'

# perftest without -R (QP data over TCP 18515, GID index by -x 1): the kernel side of the future
# one-sided scenarios below, checked in the guest alone.
for op in write read atomic; do
  args="-d rxe0 -x 1 -F -n 100"; size=8
  [ $op = atomic ] || { args+=" -s 5000"; size=5000; }
  scenario "kernel-$op-bw-loopback" role=guest-only \
    desc="kernel ib_${op}_bw server and client (no rdma_cm), both in the guest" \
    guest="ib_${op}_bw $args & srv=\$!; wait_listen 18515; ib_${op}_bw $args \$GUEST_IP && wait \$srv" \
    expect_guest="^ *$size +100 +[0-9.]+ +[0-9.]+"
done

scenario host-ping-guest role=host-client \
  desc="the host reaches the guest over the tap (ICMP)" \
  guest='ready' \
  host='busybox ping -c 3 -W 5 $GUEST_IP' \
  expect_host='3 packets received'

scenario kernel-cm-reaches-host role=host-server timeout=60 \
  desc="kernel rxe packets (rping's CM ConnectRequest MAD) cross the tap; pcap in \$OUT/cm-to-host.pcap" \
  host='exec tcpdump -Z root -i tap0 -n -U -c 1 -w "$OUT/cm-to-host.pcap" "udp dst port 4791 and src $GUEST_IP"' \
  host_ready='host_log_has "listening on tap0"' \
  guest='until_host_done timeout 50 rping -c -a $HOST_IP -C 1 -v; true' \
  check='tcpdump -n -r "$OUT/cm-to-host.pcap" | grep -E "IP 10\.77\.0\.2\.[0-9]+ > 10\.77\.0\.1\.4791: UDP"'

# The host is a TCP-only fake of ibv_rc_pingpong's server (QPN 0xabc, PSN 0x123, GID ::ffff:10.77.0.1):
# the kernel client's RC SEND_ONLY (opcode 0x04) and its retransmissions must reach the host, to the
# advertised QPN. Nothing acknowledges them; Debian 12's rxe then retransmits every ~68 ms without
# ever reporting retry-exceeded, so the guest stops its client once the host has its packets.
scenario kernel-rc-send-reaches-host role=host-server timeout=60 \
  desc="kernel ibv_rc_pingpong client vs a TCP-only fake peer: RC SENDs reach the host; pcap in \$OUT/rc-send-to-host.pcap" \
  host='tcpdump -Z root -i tap0 -n -U -c 3 -w "$OUT/rc-send-to-host.pcap" "udp dst port 4791" & dump=$!
        python3 "$INTEROP_DIR/fake_rc_peer.py" serve 0xabc 0x123 00000000000000000000ffff0a4d0001 &&
        wait $dump' \
  host_ready='host_listening 18515 && host_log_has "listening on tap0"' \
  guest='until_host_done ibv_rc_pingpong -d rxe0 -g 1 -n 1 -s 64 $HOST_IP' \
  expect_guest='remote address: LID 0x0000, QPN 0x000abc, PSN 0x000123, GID ::ffff:10\.77\.0\.1' \
  expect_host='fake peer: client 10\.77\.0\.2 LID 0000 QPN [0-9a-f]{6} PSN [0-9a-f]{6} GID 00000000000000000000ffff0a4d0002' \
  check='python3 "$INTEROP_DIR/fake_rc_peer.py" pcap "$OUT/rc-send-to-host.pcap" 0xabc | grep "opcode 0x04"'

# --- softrdma <-> kernel: rc_pingpong (examples/rc_pingpong.rs), SKIP until it is built. ----------
# Host binary contract: $EX/rc_pingpong takes ibv_rc_pingpong's flags, does its TCP exchange on port
# 18515 and prints its result lines; it opens the first device, which is tap0 (10.77.0.1): no
# SOFTRDMA_ADDR, as a user would run it.

# rc_pingpong_pair TAG ARGS: kernel server + softrdma client, then softrdma server + kernel client.
rc_pingpong_pair() {
  local tag=$1 args=$2 n s bytes
  n=$(sed -nE 's/.*-n ([0-9]+).*/\1/p' <<<"$args"); s=$(sed -nE 's/.*-s ([0-9]+).*/\1/p' <<<"$args")
  bytes=$((2 * n * s))
  scenario "rc-pingpong-$tag-kernel-server" role=host-client needs=rc_pingpong timeout=60 \
    desc="kernel ibv_rc_pingpong $args server in the guest, softrdma rc_pingpong client" \
    guest="ibv_rc_pingpong -d rxe0 $args & srv=\$!; wait_listen 18515 && ready && wait \$srv" \
    host="\"\$EX/rc_pingpong\" $args \$GUEST_IP" \
    expect_guest="^$bytes bytes in [0-9.]+ seconds" expect_host="^$bytes bytes in [0-9.]+ seconds"
  scenario "rc-pingpong-$tag-host-server" role=host-server needs=rc_pingpong timeout=60 \
    desc="softrdma rc_pingpong $args server, kernel ibv_rc_pingpong client in the guest" \
    host="\"\$EX/rc_pingpong\" $args" host_ready='host_listening 18515' \
    guest="ibv_rc_pingpong -d rxe0 $args \$HOST_IP" \
    expect_guest="^$bytes bytes in [0-9.]+ seconds" expect_host="^$bytes bytes in [0-9.]+ seconds"
}
rc_pingpong_pair 4k       "-g 1 -n 100 -s 4096"
rc_pingpong_pair 4k-m1024 "-g 1 -n 100 -s 4096 -m 1024"
rc_pingpong_pair 10k      "-g 1 -n 100 -s 10000"
rc_pingpong_pair 10k-m4096 "-g 1 -n 100 -s 10000 -m 4096"
rc_pingpong_pair 4k-events "-g 1 -n 100 -s 4096 -e"

# --- softrdma <-> kernel: ibv_uc_pingpong (examples/rc_pingpong.rs --uc). ------------------------
# ibv_uc_pingpong's flow is ibv_rc_pingpong's with a UC QP (RTR: path, MTU, QPN, PSN; RTS: the send
# PSN only): the same TCP exchange and output. UC has no retransmission, so a lost packet would
# hang a run; the tap loses none at one message in flight. Multi-packet messages at 1024 and 4096.
# uc_pingpong_pair TAG ARGS: kernel server + softrdma client, then softrdma server + kernel client.
uc_pingpong_pair() {
  local tag=$1 args=$2 n s bytes
  n=$(sed -nE 's/.*-n ([0-9]+).*/\1/p' <<<"$args"); s=$(sed -nE 's/.*-s ([0-9]+).*/\1/p' <<<"$args")
  bytes=$((2 * n * s))
  scenario "uc-pingpong-$tag-kernel-server" role=host-client needs=rc_pingpong timeout=60 \
    desc="kernel ibv_uc_pingpong $args server in the guest, softrdma rc_pingpong --uc client" \
    guest="ibv_uc_pingpong -d rxe0 $args & srv=\$!; wait_listen 18515 && ready && wait \$srv" \
    host="\"\$EX/rc_pingpong\" --uc $args \$GUEST_IP" \
    expect_guest="^$bytes bytes in [0-9.]+ seconds" expect_host="^$bytes bytes in [0-9.]+ seconds"
  scenario "uc-pingpong-$tag-host-server" role=host-server needs=rc_pingpong timeout=60 \
    desc="softrdma rc_pingpong --uc $args server, kernel ibv_uc_pingpong client in the guest" \
    host="\"\$EX/rc_pingpong\" --uc $args" host_ready='host_listening 18515' \
    guest="ibv_uc_pingpong -d rxe0 $args \$HOST_IP" \
    expect_guest="^$bytes bytes in [0-9.]+ seconds" expect_host="^$bytes bytes in [0-9.]+ seconds"
}
uc_pingpong_pair 4k        "-g 1 -n 100 -s 4096"
uc_pingpong_pair 10k-m4096 "-g 1 -n 100 -s 10000 -m 4096"
uc_pingpong_pair 4k-events "-g 1 -n 100 -s 4096 -e"

# --- softrdma <-> kernel: ud_pingpong (examples/ud_pingpong.rs), SKIP until it is built. ----------
# Same exchange as rc_pingpong (TCP 18515, LID:QPN:PSN:GID); every message is one UD SEND with
# Q_Key 0x11111111 to an AH built from the peer's GID; receive buffers start with the 40-byte GRH
# area. The guest's port MTU is 4096 (eth0 MTU 9000), so -s may be up to 4096.
# ud_pingpong_pair TAG ARGS: kernel server + softrdma client, then softrdma server + kernel client.
ud_pingpong_pair() {
  local tag=$1 args=$2 n s bytes
  n=$(sed -nE 's/.*-n ([0-9]+).*/\1/p' <<<"$args"); s=$(sed -nE 's/.*-s ([0-9]+).*/\1/p' <<<"$args")
  bytes=$((2 * n * s))
  scenario "ud-pingpong-$tag-kernel-server" role=host-client needs=ud_pingpong timeout=60 \
    desc="kernel ibv_ud_pingpong $args server in the guest, softrdma ud_pingpong client" \
    guest="ibv_ud_pingpong -d rxe0 $args & srv=\$!; wait_listen 18515 && ready && wait \$srv" \
    host="\"\$EX/ud_pingpong\" $args \$GUEST_IP" \
    expect_guest="^$bytes bytes in [0-9.]+ seconds" expect_host="^$bytes bytes in [0-9.]+ seconds"
  scenario "ud-pingpong-$tag-host-server" role=host-server needs=ud_pingpong timeout=60 \
    desc="softrdma ud_pingpong $args server, kernel ibv_ud_pingpong client in the guest" \
    host="\"\$EX/ud_pingpong\" $args" host_ready='host_listening 18515' \
    guest="ibv_ud_pingpong -d rxe0 $args \$HOST_IP" \
    expect_guest="^$bytes bytes in [0-9.]+ seconds" expect_host="^$bytes bytes in [0-9.]+ seconds"
}
ud_pingpong_pair 2k     "-g 1 -n 100 -s 2048"
ud_pingpong_pair 4k     "-g 1 -n 100 -s 4096"
ud_pingpong_pair 1k-events "-g 1 -n 100 -s 1024 -e"

# --- perftest <-> kernel: one-sided WRITE/READ/atomics (examples/perftest.rs), SKIP until built. ---
# One-sided operations against perftest without -R (QP data exchanged over TCP port 18515, GID index
# with -x 1), softrdma side: examples/perftest.rs (`perftest write|read|atomic [opts] [server]`).
# perftest_pair TAG OP ARGS SIZE ITERS [ERE]: kernel ib_OP_bw server + softrdma client (softrdma
# issues the WRITEs/READs/atomics into kernel memory), then softrdma server + kernel client (the
# kernel issues them into softrdma memory). Both sides print perftest's result line
# "SIZE ITERS peak avg msgrate" (the server prints the client's report). ERE: one more line the
# softrdma server must print.
perftest_pair() {
  local tag=$1 op=$2 args=$3 size=$4 n=$5 extra=${6:-}
  local line="^ *$size +$n +[0-9.]+ +[0-9.]+[[:space:]]+[0-9.]+"
  scenario "perftest-$tag-kernel-server" role=host-client needs=perftest timeout=90 \
    desc="kernel ib_${op}_bw $args server in the guest, softrdma perftest $op client" \
    guest="ib_${op}_bw -d rxe0 $args & srv=\$!; wait_listen 18515 && ready && wait \$srv" \
    host="\"\$EX/perftest\" $op $args \$GUEST_IP" \
    expect_guest="$line" expect_host="$line"
  scenario "perftest-$tag-host-server" role=host-server needs=perftest timeout=90 \
    desc="softrdma perftest $op $args server, kernel ib_${op}_bw client in the guest" \
    host="\"\$EX/perftest\" $op $args" host_ready='host_listening 18515' \
    guest="ib_${op}_bw -d rxe0 $args \$HOST_IP" \
    expect_guest="$line" expect_host="$line" ${extra:+expect_host="$extra"}
}
perftest_pair write       write  "-x 1 -F -n 200 -s 65536"         65536 200
perftest_pair write-m1024 write  "-x 1 -F -n 200 -s 10000 -m 1024" 10000 200
perftest_pair read        read   "-x 1 -F -n 200 -s 65536"         65536 200
perftest_pair read-m1024  read   "-x 1 -F -n 200 -s 10000 -m 1024" 10000 200
# Every kernel FETCH_AND_ADD adds 1 to a zeroed 8-byte word of the softrdma server's memory.
perftest_pair atomic-fadd atomic "-x 1 -F -n 200 -A FETCH_AND_ADD" 8     200 \
  'atomic check: the target words sum to 200 '
perftest_pair atomic-cas  atomic "-x 1 -F -n 200 -A CMP_AND_SWAP"  8     200
perftest_pair send        send   "-x 1 -F -n 200 -s 65536"         65536 200

# --- rdma_cm <-> kernel: rping (examples/rping.rs), SKIP until it is built. -----------------------
# The CM handshake (REQ/REP/RTU over QP1, rdma_cm's IP private-data header), then rping's protocol:
# the client advertises its buffers by SEND, the server RDMA READs the ping data and RDMA WRITEs it
# back; -V makes the client check every byte; the client's disconnect (DREQ/DREP) ends both.
# rping_pair TAG ARGS
rping_pair() {
  local tag=$1 args=$2 n
  n=$(sed -nE 's/.*-C ([0-9]+).*/\1/p' <<<"$args")
  local last="rdma-ping-$((n - 1)): "
  scenario "rping-$tag-kernel-server" role=host-client needs=rping timeout=90 \
    desc="kernel rping -s in the guest, softrdma rping -c $args" \
    guest="rping -s -a \$GUEST_IP -v $args & srv=\$!; sleep 3; ready; wait \$srv" \
    host="for i in 1 2 3 4 5 6; do \"\$EX/rping\" -c -a \$GUEST_IP -V -v $args && exit 0; sleep 2; done; exit 1" \
    expect_host="^ping data: $last" expect_guest="^server ping data: $last"
  scenario "rping-$tag-host-server" role=host-server needs=rping timeout=90 \
    desc="softrdma rping -s, kernel rping -c $args in the guest" \
    host="\"\$EX/rping\" -s -a \$HOST_IP -v $args" \
    guest="rping -c -a \$HOST_IP -V -v $args" \
    expect_host="^server ping data: $last" expect_guest="^ping data: $last"
}
rping_pair small "-C 5 -S 64"
rping_pair 10k   "-C 3 -S 10000"

# --- rdma_cm <-> kernel: ucmatose (examples/cmatose.rs), several connections at once. ------------
# The server accepts -c connections, SENDs -C messages on each, receives as many, disconnects.
scenario cmatose-kernel-server role=host-client needs=cmatose timeout=90 \
  desc="kernel ucmatose server (5 connections x 20 messages) in the guest, softrdma cmatose client" \
  guest='ucmatose -c 5 -C 20 & srv=$!; sleep 3; ready; wait $srv' \
  host='for i in 1 2 3 4 5 6; do "$EX/cmatose" -s $GUEST_IP -c 5 -C 20 && exit 0; sleep 2; done; exit 1' \
  expect_host='^return status 0' expect_guest='^return status 0' expect_guest='^data transfers complete'
scenario cmatose-host-server role=host-server needs=cmatose timeout=90 \
  desc="softrdma cmatose server (5 connections x 20 messages), kernel ucmatose client in the guest" \
  host='"$EX/cmatose" -b $HOST_IP -c 5 -C 20' \
  guest='ucmatose -s $HOST_IP -c 5 -C 20' \
  expect_host='^return status 0' expect_host='^data transfers complete' expect_guest='^return status 0'

# --- perftest -R <-> kernel: the side channel and the test QP both connected with rdma_cm. --------
# perftest 4.5's -R: an RC "comm" connection (versions, keys and reports as SENDs, keys in binary),
# then a second rdma_cm connection for the test QP on the same port, then the test.
perftest_r_pair() {
  local tag=$1 op=$2 args=$3 size=$4 n=$5
  local line="^ *$size +$n +[0-9.]+ +[0-9.]+[[:space:]]+[0-9.]+"
  scenario "perftest-R-$tag-kernel-server" role=host-client needs=perftest timeout=90 \
    desc="kernel ib_${op}_bw -R $args server in the guest, softrdma perftest $op -R client" \
    guest="ib_${op}_bw -d rxe0 -R $args & srv=\$!; sleep 3; ready; wait \$srv" \
    host="for i in 1 2 3 4 5 6; do \"\$EX/perftest\" $op -R $args \$GUEST_IP && exit 0; sleep 2; done; exit 1" \
    expect_guest="$line" expect_host="$line"
  scenario "perftest-R-$tag-host-server" role=host-server needs=perftest timeout=90 \
    desc="softrdma perftest $op -R $args server, kernel ib_${op}_bw -R client in the guest" \
    host="\"\$EX/perftest\" $op -R $args" \
    guest="ib_${op}_bw -d rxe0 -R $args \$HOST_IP" \
    expect_guest="$line" expect_host="$line"
}
perftest_r_pair write write "-x 1 -F -n 200 -s 65536" 65536 200
perftest_r_pair read  read  "-x 1 -F -n 200 -s 65536" 65536 200
perftest_r_pair send  send  "-x 1 -F -n 200 -s 65536" 65536 200

# --- rdma_cm UDP port space <-> kernel: udaddy (examples/udaddy.rs). ------------------------------
# SIDR_REQ/SIDR_REP resolve the server's UD QP and Q_Key; the client SENDs with its QPN as
# immediate data, the server replies through an address handle made from the first receive.
scenario udaddy-kernel-server role=host-client needs=udaddy timeout=90 \
  desc="kernel udaddy server (2 ids x 20 datagrams) in the guest, softrdma udaddy client" \
  guest='udaddy -c 2 -C 20 & srv=$!; sleep 3; ready; wait $srv' \
  host='for i in 1 2 3 4 5 6; do "$EX/udaddy" -s $GUEST_IP -c 2 -C 20 && exit 0; sleep 2; done; exit 1' \
  expect_host='^return status 0' expect_guest='^return status 0' expect_guest='^data transfers complete'
scenario udaddy-host-server role=host-server needs=udaddy timeout=90 \
  desc="softrdma udaddy server (2 ids x 20 datagrams), kernel udaddy client in the guest" \
  host='"$EX/udaddy" -b $HOST_IP -c 2 -C 20' \
  guest='udaddy -s $HOST_IP -c 2 -C 20' \
  expect_host='^return status 0' expect_host='^data transfers complete' expect_guest='^return status 0'

# --- rdma_cm edge cases against the kernel. ---------------------------------------------------------
scenario cmatose-burst-host-server role=host-server needs=cmatose timeout=120 \
  desc="softrdma cmatose server, kernel ucmatose client opening 20 connections at once" \
  host='"$EX/cmatose" -b $HOST_IP -c 20 -C 10' \
  guest='ucmatose -s $HOST_IP -c 20 -C 10' \
  expect_host='^return status 0' expect_guest='^return status 0'
# A port nobody listens on: REJ with reason 8 (invalid service ID), either way.
scenario rping-no-listener-on-host role=host-server needs=rping timeout=60 guest_rc=any \
  desc="kernel rping -c to a softrdma host port nobody listens on: REJECTED, error 8" \
  host='timeout 8 "$EX/rping" -s -a $HOST_IP -p 7174 -v; true' \
  guest='rping -c -a $HOST_IP -p 7999 -C 1 -v' \
  expect_guest='RDMA_CM_EVENT_REJECTED, error 8'
scenario rping-no-listener-in-guest role=host-client needs=rping timeout=60 host_rc=any \
  desc="softrdma rping -c to a guest port nobody listens on: REJECTED, error 8" \
  guest='ready; sleep 5' \
  host='"$EX/rping" -c -a $GUEST_IP -p 7999 -C 1 -v' \
  expect_host='RDMA_CM_EVENT_REJECTED, error 8'

# --- Debian's unmodified programs on softrdma's libibverbs.so.1 / librdmacm.so.1 (capi/). --------
# The host side runs the very binaries the guest runs (rdma-core's and perftest's, from Debian),
# through `softrdma run --`, which puts softrdma's libraries first on the library path.
# capi_pair TAG GUEST_SERVER HOST_CLIENT HOST_SERVER GUEST_CLIENT ERE [READY]: kernel server +
# softrdma client, then softrdma server + kernel client; ERE must match both sides' output.
# READY: how the host server is seen listening (default: TCP 18515, the tools' exchange port).
CAPI="$EX/../softrdma"
capi_pair() {
  local tag=$1 gsrv=$2 hcli=$3 hsrv=$4 gcli=$5 ere=$6 ready=${7:-host_listening 18515}
  scenario "capi-$tag-kernel-server" role=host-client needs="$CAPI" timeout=90 \
    desc="kernel $gsrv in the guest, Debian's $hcli on softrdma" \
    guest="$gsrv & srv=\$!; sleep 2; ready; wait \$srv" \
    host="for i in 1 2 3 4 5 6; do \"\$EX/../softrdma\" run -- $hcli && exit 0; sleep 2; done; exit 1" \
    expect_guest="$ere" expect_host="$ere"
  scenario "capi-$tag-host-server" role=host-server needs="$CAPI" timeout=90 \
    desc="Debian's $hsrv on softrdma, kernel $gcli in the guest" \
    host="\"\$EX/../softrdma\" run -- $hsrv" host_ready="$ready" \
    guest="$gcli" \
    expect_guest="$ere" expect_host="$ere"
}
capi_pair rc-pingpong \
  'ibv_rc_pingpong -d rxe0 -g 1 -n 100 -s 4096' 'ibv_rc_pingpong -g 1 -n 100 -s 4096 $GUEST_IP' \
  'ibv_rc_pingpong -g 1 -n 100 -s 4096' 'ibv_rc_pingpong -d rxe0 -g 1 -n 100 -s 4096 $HOST_IP' \
  '^819200 bytes in [0-9.]+ seconds'
capi_pair ud-pingpong \
  'ibv_ud_pingpong -d rxe0 -g 1 -n 100 -s 2048' 'ibv_ud_pingpong -g 1 -n 100 -s 2048 $GUEST_IP' \
  'ibv_ud_pingpong -g 1 -n 100 -s 2048' 'ibv_ud_pingpong -d rxe0 -g 1 -n 100 -s 2048 $HOST_IP' \
  '^409600 bytes in [0-9.]+ seconds'
capi_pair srq-pingpong \
  'ibv_srq_pingpong -d rxe0 -g 1 -n 50 -s 4096' 'ibv_srq_pingpong -g 1 -n 50 -s 4096 $GUEST_IP' \
  'ibv_srq_pingpong -g 1 -n 50 -s 4096' 'ibv_srq_pingpong -d rxe0 -g 1 -n 50 -s 4096 $HOST_IP' \
  '^409600 bytes in [0-9.]+ seconds'
capi_pair uc-pingpong \
  'ibv_uc_pingpong -d rxe0 -g 1 -n 100 -s 4096' 'ibv_uc_pingpong -g 1 -n 100 -s 4096 $GUEST_IP' \
  'ibv_uc_pingpong -g 1 -n 100 -s 4096' 'ibv_uc_pingpong -d rxe0 -g 1 -n 100 -s 4096 $HOST_IP' \
  '^819200 bytes in [0-9.]+ seconds'

# The rdma_cm tools and perftest, Debian's binaries on softrdma's librdmacm.so.1 against the
# kernel's. rping: -v prints the data on both sides; the last ping names both ends' progress.
capi_pair rping \
  'rping -s -a $GUEST_IP -p 7996 -C 5 -S 64 -v' 'rping -c -a $GUEST_IP -p 7996 -C 5 -S 64 -V -v' \
  'rping -s -a $HOST_IP -p 7996 -C 5 -S 64 -v' 'rping -c -a $HOST_IP -p 7996 -C 5 -S 64 -V -v' \
  'ping data: rdma-ping-4: ' 'sleep 2'
capi_pair ucmatose \
  'ucmatose -c 3 -C 10' 'ucmatose -s $GUEST_IP -c 3 -C 10' \
  'ucmatose -b $HOST_IP -c 3 -C 10' 'ucmatose -s $HOST_IP -c 3 -C 10' \
  '^data transfers complete' 'sleep 2'
capi_pair udaddy \
  'udaddy' 'udaddy -s $GUEST_IP' \
  'udaddy -b $HOST_IP' 'udaddy -s $HOST_IP' \
  '^data transfers complete' 'sleep 2'
# rdma_server/rdma_client: synchronous endpoints (rdma_create_ep, rdma_get_request) and the
# rdma_verbs.h helpers, on the librdmacm side; the kernel side is rdma-core's own librdmacm.
capi_pair rdma-server-client \
  'rdma_server -p 7471' 'rdma_client -s $GUEST_IP -p 7471' \
  'rdma_server -p 7471' 'rdma_client -s $HOST_IP -p 7471' \
  ': end 0' 'sleep 2'
# perftest, every test with its TCP exchange and with -R: both sides print the result line
# "SIZE ITERS ..." (bandwidth: the server the client's report; latency: their own, "inf" in the
# guest when perftest cannot time qemu's CPU), except ib_read_lat's and ib_atomic_lat's server,
# which only lends its memory and returns from main (with -R its rdma_cm connections still up:
# the client then waits for DISCONNECTED, which softrdma's exit handler sends as Linux does).
capi_perftest() {
  local t=$1 k=$2 r=$3 sz=2 sarg line both=1 tag ks=() hs=()
  [ "$k" = bw ] && sz=65536
  [ "$t" = atomic ] && sz=8
  sarg="-s $sz"; [ "$t" = atomic ] && sarg=""
  { [ "$k" = lat ] && { [ "$t" = read ] || [ "$t" = atomic ]; }; } && both=0
  line="^ *$sz +200 +([0-9.]+|inf) +([0-9.]+|inf)"
  tag="ib-$t-$k${r:+-R}"
  [ $both = 1 ] && ks=("expect_guest=$line") && hs=("expect_host=$line")
  local ready='host_listening 18515'
  [ -n "$r" ] && ready='sleep 2'
  scenario "capi-$tag-kernel-server" role=host-client needs="$CAPI" timeout=90 \
    desc="kernel ib_${t}_$k $r in the guest, Debian's ib_${t}_$k $r on softrdma" \
    guest="ib_${t}_$k -d rxe0 $r -x 1 -F -n 200 $sarg & srv=\$!; sleep 2; ready; wait \$srv" \
    host="for i in 1 2 3 4 5 6; do \"\$EX/../softrdma\" run -- ib_${t}_$k $r -x 1 -F -n 200 $sarg \$GUEST_IP && exit 0; sleep 2; done; exit 1" \
    expect_host="$line" "${ks[@]}"
  scenario "capi-$tag-host-server" role=host-server needs="$CAPI" timeout=90 \
    desc="Debian's ib_${t}_$k $r server on softrdma, kernel ib_${t}_$k $r client in the guest" \
    host="\"\$EX/../softrdma\" run -- ib_${t}_$k $r -x 1 -F -n 200 $sarg" host_ready="$ready" \
    guest="ib_${t}_$k -d rxe0 $r -x 1 -F -n 200 $sarg \$HOST_IP" \
    expect_guest="$line" "${hs[@]}"
}
for t in send write read atomic; do
  for k in bw lat; do
    for r in "" -R; do capi_perftest $t $k "$r"; done
  done
done
# Softrdma's Rust perftest send_lat against the kernel's ib_send_lat, both ways.
scenario perftest-send-lat-kernel-server role=host-client needs=perftest timeout=90 \
  desc="kernel ib_send_lat server in the guest, softrdma perftest send_lat client" \
  guest="ib_send_lat -d rxe0 -x 1 -F -n 200 -s 2 & srv=\$!; wait_listen 18515 && ready && wait \$srv" \
  host="\"\$EX/perftest\" send_lat -x 1 -F -n 200 -s 2 \$GUEST_IP" \
  expect_guest='^ *2 +200 +([0-9.]+|inf) +([0-9.]+|inf)' expect_host='^ *2 +200 +([0-9.]+|inf) +([0-9.]+|inf)'
scenario perftest-send-lat-host-server role=host-server needs=perftest timeout=90 \
  desc="softrdma perftest send_lat server, kernel ib_send_lat client in the guest" \
  host="\"\$EX/perftest\" send_lat -x 1 -F -n 200 -s 2" host_ready='host_listening 18515' \
  guest="ib_send_lat -d rxe0 -x 1 -F -n 200 -s 2 \$HOST_IP" \
  expect_guest='^ *2 +200 +([0-9.]+|inf) +([0-9.]+|inf)' expect_host='^ *2 +200 +([0-9.]+|inf) +([0-9.]+|inf)'

# --- IPv6: RoCEv2 over IPv6 (fd77::1 on the host, fd77::2 in the guest, same link). --------------
# The guest's GID of fd77::2 is wherever rxe put it (gid_index); the host device's is index 2 (its
# IPv4-mapped GID at 0 and 1, then its IPv6 addresses, global ones first). The ICRC covers the IPv6
# header: a wrong one and the kernel drops every packet.
G6=fd77:0000:0000:0000:0000:0000:0000:0002
scenario kernel-rxe-ipv6-gid role=guest-only \
  desc="rxe lists eth0's IPv6 address fd77::2 as a RoCE v2 GID" \
  guest="i=\$(gid_index $G6); echo \"gid6 index \$i\"; ibv_devinfo -d rxe0 -v | grep GID" \
  expect_guest='^gid6 index [0-9]+$' expect_guest='fd77::2'

# v6_pingpong_pair PROG HOSTPROG TAG ARGS: IPv6 GIDs on both sides (-g), both ways.
v6_pingpong_pair() {
  local prog=$1 hprog=$2 tag=$3 args=$4 n s bytes
  n=$(sed -nE 's/.*-n ([0-9]+).*/\1/p' <<<"$args"); s=$(sed -nE 's/.*-s ([0-9]+).*/\1/p' <<<"$args")
  bytes=$((2 * n * s))
  scenario "$tag-v6-kernel-server" role=host-client needs="${hprog%% *}" timeout=60 \
    desc="IPv6 GIDs: kernel $prog $args server in the guest, softrdma $hprog client" \
    guest="$prog -d rxe0 -g \$(gid_index $G6) $args & srv=\$!; wait_listen 18515 && ready && wait \$srv" \
    host="\"\$EX/$hprog\" -g 2 $args \$GUEST_IP" \
    expect_guest="^$bytes bytes in [0-9.]+ seconds" expect_host="^$bytes bytes in [0-9.]+ seconds" \
    expect_host="remote address: .* GID fd77::2\$" expect_guest="remote address: .* GID fd77::1\$"
  scenario "$tag-v6-host-server" role=host-server needs="${hprog%% *}" timeout=60 \
    desc="IPv6 GIDs: softrdma $hprog $args server, kernel $prog client in the guest" \
    host="\"\$EX/$hprog\" -g 2 $args" host_ready='host_listening 18515' \
    guest="$prog -d rxe0 -g \$(gid_index $G6) $args \$HOST_IP" \
    expect_guest="^$bytes bytes in [0-9.]+ seconds" expect_host="^$bytes bytes in [0-9.]+ seconds" \
    expect_host="remote address: .* GID fd77::2\$" expect_guest="remote address: .* GID fd77::1\$"
}
v6_pingpong_pair ibv_rc_pingpong rc_pingpong rc-pingpong-4k "-n 100 -s 4096"
v6_pingpong_pair ibv_rc_pingpong rc_pingpong rc-pingpong-10k-m1024 "-n 100 -s 10000 -m 1024"
v6_pingpong_pair ibv_ud_pingpong ud_pingpong ud-pingpong-2k "-n 100 -s 2048"

# Debian's ibv_rc_pingpong on softrdma's libibverbs.so.1 over IPv6 GIDs.
capi_pair rc-pingpong-v6 \
  "ibv_rc_pingpong -d rxe0 -g \$(gid_index $G6) -n 100 -s 4096" 'ibv_rc_pingpong -g 2 -n 100 -s 4096 $GUEST_IP' \
  'ibv_rc_pingpong -g 2 -n 100 -s 4096' "ibv_rc_pingpong -d rxe0 -g \$(gid_index $G6) -n 100 -s 4096 \$HOST_IP" \
  '^819200 bytes in [0-9.]+ seconds'

# rdma_cm over IPv6: the REQ carries rdma_cm's IPv6 header and IPv6 GIDs in its path.
scenario rping-v6-kernel-server role=host-client needs=rping timeout=90 \
  desc="kernel rping -s -a fd77::2 in the guest, softrdma rping -c -a fd77::2" \
  guest='rping -s -a $GUEST_IP6 -v -C 5 -S 64 & srv=$!; sleep 3; ready; wait $srv' \
  host='for i in 1 2 3 4 5 6; do "$EX/rping" -c -a $GUEST_IP6 -V -v -C 5 -S 64 && exit 0; sleep 2; done; exit 1' \
  expect_host='^ping data: rdma-ping-4: ' expect_guest='^server ping data: rdma-ping-4: '
scenario rping-v6-wildcard-host-server role=host-server needs=rping timeout=90 \
  desc="softrdma rping -s -a :: (IPv6 wildcard), kernel rping -c -a fd77::1 in the guest" \
  host='"$EX/rping" -s -a :: -v -C 5 -S 64' \
  guest='rping -c -a $HOST_IP6 -V -v -C 5 -S 64' \
  expect_host='^server ping data: rdma-ping-4: ' expect_guest='^ping data: rdma-ping-4: '
scenario rping-v4-to-v6-wildcard-host-server role=host-server needs=rping timeout=90 \
  desc="softrdma rping -s -a :: takes the kernel's IPv4 rping -c -a 10.77.0.1 (as Linux does)" \
  host='"$EX/rping" -s -a :: -v -C 5 -S 64' \
  guest='rping -c -a $HOST_IP -V -v -C 5 -S 64' \
  expect_host='^server ping data: rdma-ping-4: ' expect_guest='^ping data: rdma-ping-4: '
scenario udaddy-v6-kernel-server role=host-client needs=udaddy timeout=90 \
  desc="kernel udaddy -b fd77::2 (SIDR, UD over IPv6) in the guest, softrdma udaddy client" \
  guest='udaddy -b $GUEST_IP6 -c 2 -C 20 & srv=$!; sleep 3; ready; wait $srv' \
  host='for i in 1 2 3 4 5 6; do "$EX/udaddy" -s $GUEST_IP6 -c 2 -C 20 && exit 0; sleep 2; done; exit 1' \
  expect_host='^return status 0' expect_guest='^return status 0' expect_guest='^data transfers complete'
scenario udaddy-v6-host-server role=host-server needs=udaddy timeout=90 \
  desc="softrdma udaddy -b fd77::1, kernel udaddy client in the guest" \
  host='"$EX/udaddy" -b $HOST_IP6 -c 2 -C 20' \
  guest='udaddy -s $HOST_IP6 -c 2 -C 20' \
  expect_host='^return status 0' expect_host='^data transfers complete' expect_guest='^return status 0'

# --- RC under loss: 2% of the packets dropped each way (last: they change the link). -------------
# The guest drops 2% of what it sends (netem on eth0); the host drops 2% of what it sends to the
# guest (an nftables netdev egress rule on tap0; needs nft on the host, else SKIP). softrdma's
# requester against the kernel's responder (go-back on its one NAK per sequence error, probes
# when that NAK, a retransmission or the tail is lost), and the kernel's requester against
# softrdma's responder; every WRITE must complete (perftest's result line on both sides).
LOSS_ON='{ nft delete table netdev loss 2>/dev/null; echo "table netdev loss { chain out { type filter hook egress device tap0 priority 0; meta protocol ip numgen random mod 100 < 2 drop; }; }" | nft -f -; }'
LOSS_OFF='nft delete table netdev loss'
loss_line="^ *65536 +300 +[0-9.]+ +[0-9.]+[[:space:]]+[0-9.]+"
scenario perftest-write-loss2-kernel-server role=host-client needs="perftest /usr/sbin/nft" timeout=110 \
  desc="2% loss each way: kernel ib_write_bw server, softrdma perftest write client" \
  guest='/usr/sbin/tc qdisc add dev eth0 root netem loss 2% || exit 3
         ib_write_bw -d rxe0 -x 1 -F -n 300 -s 65536 & srv=$!
         wait_listen 18515 && ready && wait $srv; rc=$?; /usr/sbin/tc qdisc del dev eth0 root; exit $rc' \
  host="$LOSS_ON"' || exit 3; "$EX/perftest" write -x 1 -F -n 300 -s 65536 $GUEST_IP; rc=$?; '"$LOSS_OFF"'; exit $rc' \
  expect_guest="$loss_line" expect_host="$loss_line"
scenario perftest-write-loss2-host-server role=host-server needs="perftest /usr/sbin/nft" timeout=110 \
  desc="2% loss each way: softrdma perftest write server, kernel ib_write_bw client" \
  host="$LOSS_ON"' || exit 3; "$EX/perftest" write -x 1 -F -n 300 -s 65536; rc=$?; '"$LOSS_OFF"'; exit $rc' \
  host_ready='host_listening 18515' \
  guest='/usr/sbin/tc qdisc add dev eth0 root netem loss 2% || exit 3
         ib_write_bw -d rxe0 -x 1 -F -n 300 -s 65536 $HOST_IP; rc=$?; /usr/sbin/tc qdisc del dev eth0 root; exit $rc' \
  expect_guest="$loss_line" expect_host="$loss_line"
