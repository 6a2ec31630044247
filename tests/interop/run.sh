#!/bin/bash
# Interoperability tests of softrdma against Linux Soft-RoCE (kernel rdma_rxe in a qemu guest).
#
#   sudo tests/interop/run.sh [-l] [NAME-REGEX]     (-l: list the scenarios and exit)
#
# Installs the Debian packages it needs (fast when present), builds the guest into a cache dir
# (reused while its inputs are unchanged), boots the guest ONCE on a tap device inside a private
# network namespace, and runs every scenario of scenarios.sh in that one boot: one side is the
# kernel in the guest (10.77.0.2), the other a program on the host run with `ip netns exec`
# (10.77.0.1). Prints PASS/FAIL/SKIP per scenario and ends with the line "N passed, M failed";
# exits non-zero if any scenario failed (skipped ones do not fail the run).
#
# Environment (all optional):
#   INTEROP_EXAMPLES  host binaries               (default: target/release/examples)
#   INTEROP_OUT       logs, pcaps, the 9p share   (default: target/interop)
#   INTEROP_CACHE     kernel + initramfs cache    (default: target/rxe-vm)
#   INTEROP_SCENARIOS another scenario file      (default: tests/interop/scenarios.sh)
#   INTEROP_NO_DEPS=1 do not run vm/install-deps.sh
#   INTEROP_BUDGET    seconds for all scenarios; the ones left after it FAIL unrun (default 480)
#   INTEROP_VM_CPUS / INTEROP_VM_MEM (MiB) / INTEROP_VM_TIMEOUT (s, whole boot) / INTEROP_BOOT_TIMEOUT
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
EX=$(realpath -m "${INTEROP_EXAMPLES:-$TARGET/release/examples}")
OUT=$(realpath -m "${INTEROP_OUT:-$TARGET/interop}")
CACHE=$(realpath -m "${INTEROP_CACHE:-$TARGET/rxe-vm}")
HOST_IP=10.77.0.1
GUEST_IP=10.77.0.2
# IPv6 on the same link (nodad: usable at once), for the IPv6 scenarios.
HOST_IP6=fd77::1
GUEST_IP6=fd77::2
MTU=9000
NS=softrdma-interop-$$
VM_CPUS=${INTEROP_VM_CPUS:-2}
VM_MEM=${INTEROP_VM_MEM:-1024}
VM_TIMEOUT=${INTEROP_VM_TIMEOUT:-900}
BOOT_TIMEOUT=${INTEROP_BOOT_TIMEOUT:-180}
DEFAULT_TIMEOUT=120
DEFAULT_GRACE=20
BUDGET=${INTEROP_BUDGET:-480}

LIST_ONLY=0
if [ "${1:-}" = -l ]; then LIST_ONLY=1; shift; fi
FILTER=${1:-}

now() { echo "$EPOCHREALTIME"; }
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f s", b - a }'; }
say() { echo "[interop] $*"; }

# --- Scenario registry ----------------------------------------------------------------------------
declare -a ORDER=()
declare -A ROLE=() DESC=() NEEDS=() GUEST=() HOSTCMD=() READY=() TIMEOUT=() GRACE=() GUEST_RC=() HOST_RC=() \
  EXPECT_GUEST=() EXPECT_HOST=() CHECK=()

scenario() {
  local name=$1 kv key val; shift
  [[ $name =~ ^[A-Za-z0-9._-]+$ ]] || { echo "scenario: bad name '$name'" >&2; exit 2; }
  [ -z "${ROLE[$name]+x}" ] || { echo "scenario: duplicate '$name'" >&2; exit 2; }
  ORDER+=("$name")
  ROLE[$name]=guest-only DESC[$name]='' NEEDS[$name]='' GUEST[$name]=true HOSTCMD[$name]='' READY[$name]='sleep 1'
  TIMEOUT[$name]=$DEFAULT_TIMEOUT GRACE[$name]=$DEFAULT_GRACE GUEST_RC[$name]=0 HOST_RC[$name]=0
  EXPECT_GUEST[$name]='' EXPECT_HOST[$name]='' CHECK[$name]=''
  for kv in "$@"; do
    key=${kv%%=*} val=${kv#*=}
    case $key in
      role)
        case $val in guest-only|host-server|host-client) ROLE[$name]=$val ;;
          *) echo "scenario $name: bad role '$val'" >&2; exit 2 ;; esac ;;
      desc) DESC[$name]=$val ;;
      needs) NEEDS[$name]=$val ;;
      guest) GUEST[$name]=$val ;;
      host) HOSTCMD[$name]=$val ;;
      host_ready) READY[$name]=$val ;;
      timeout) TIMEOUT[$name]=$val ;;
      grace) GRACE[$name]=$val ;;
      guest_rc) GUEST_RC[$name]=$val ;;
      host_rc) HOST_RC[$name]=$val ;;
      expect_guest) EXPECT_GUEST[$name]+=$val$'\n' ;;
      expect_host) EXPECT_HOST[$name]+=$val$'\n' ;;
      check) CHECK[$name]=$val ;;
      *) echo "scenario $name: unknown key '$key'" >&2; exit 2 ;;
    esac
  done
  if [ "${ROLE[$name]}" != guest-only ] && [ -z "${HOSTCMD[$name]}" ]; then
    echo "scenario $name: role ${ROLE[$name]} needs host=" >&2; exit 2
  fi
}
# shellcheck source=SCRIPTDIR/scenarios.sh
source "${INTEROP_SCENARIOS:-$HERE/scenarios.sh}"

# missing_bin NAME: the first host binary the scenario needs that is not there (empty if none).
missing_bin() {
  local b p
  for b in ${NEEDS[$1]}; do
    if [[ $b == */* ]]; then p=$b; else p=$EX/$b; fi
    [ -x "$p" ] || { echo "$p"; return; }
  done
}

SELECTED=() SKIPPED=()
for name in "${ORDER[@]}"; do
  [ -z "$FILTER" ] || [[ $name =~ $FILTER ]] || continue
  if [ -n "$(missing_bin "$name")" ]; then SKIPPED+=("$name"); else SELECTED+=("$name"); fi
done

if [ "$LIST_ONLY" = 1 ]; then
  for name in "${ORDER[@]}"; do
    printf '%-34s %-11s %s\n' "$name" "${ROLE[$name]}" "${DESC[$name]}"
  done
  exit 0
fi

PASSED=0 FAILED=0
report_skips() {
  local name
  for name in "${SKIPPED[@]}"; do echo "SKIP $name (missing $(missing_bin "$name"))"; done
}
finish() {
  report_skips
  say "total: ${SECONDS} s"
  echo "${#SKIPPED[@]} skipped"
  echo "$PASSED passed, $FAILED failed"
  if [ "$FAILED" -eq 0 ]; then exit 0; else exit 1; fi
}

if [ ${#SELECTED[@]} -eq 0 ]; then say "no scenario to run"; finish; fi
[ "$(id -u)" -eq 0 ] || { echo "run.sh: needs root (network namespaces, tap devices)" >&2; exit 2; }
[ -c /dev/net/tun ] || { echo "run.sh: no /dev/net/tun: cannot give the guest a tap device" >&2; exit 2; }
cd "$ROOT"

# --- Host preparation: packages, guest image ------------------------------------------------------
t=$(now)
if [ "${INTEROP_NO_DEPS:-0}" != 1 ]; then "$HERE/vm/install-deps.sh"; fi
say "deps: $(since "$t")"

# The cached guest is rebuilt when the build script, init, kernel or tool packages change.
t=$(now)
mkdir -p "$CACHE"
stamp=$( { cat "$HERE/vm/build-initramfs.sh" "$HERE/vm/init"; ls /lib/modules;
  dpkg-query -W linux-image-amd64 ibverbs-utils ibverbs-providers rdmacm-utils perftest busybox-static \
    iproute2 tcpdump 2>/dev/null; } | sha256sum | cut -d' ' -f1)
(
  flock 9
  if [ "$(cat "$CACHE/stamp" 2>/dev/null)" != "$stamp" ] || [ ! -s "$CACHE/initramfs.cpio.gz" ]; then
    rm -f "$CACHE/stamp"
    "$HERE/vm/build-initramfs.sh" "$CACHE"
    echo "$stamp" > "$CACHE/stamp"
  fi
) 9> "$CACHE/.lock"
say "guest image: $CACHE, kernel $(cat "$CACHE/kernel-version") ($(since "$t"))"

# --- Per-run directory: the 9p share and the guest's script ---------------------------------------
mkdir -p "$OUT"
SHARE=$OUT/share
rm -rf "$SHARE" "$OUT"/*.pcap "$OUT/console.log"
mkdir -p "$SHARE/s"
cp "$HERE/vm/guest-lib.sh" "$SHARE/guest-lib.sh"
{
  echo "# Generated by tests/interop/run.sh: the guest's side of this run."
  echo "HOST_IP=$HOST_IP GUEST_IP=$GUEST_IP HOST_IP6=$HOST_IP6 GUEST_IP6=$GUEST_IP6"
  echo "export HOST_IP GUEST_IP HOST_IP6 GUEST_IP6"
  echo ". /host/guest-lib.sh"
  cat <<EOF
/usr/sbin/ip link set eth0 mtu $MTU; /usr/sbin/ip addr add $GUEST_IP/24 dev eth0; /usr/sbin/ip link set eth0 up
/usr/sbin/ip addr add $GUEST_IP6/64 dev eth0 nodad
ping -c 1 -W 5 $HOST_IP6 > /dev/null 2>&1 || echo "no IPv6 answer from the host" > /host/guest-ping6.log
rdma link add rxe0 type rxe netdev eth0
{ rdma link; /usr/sbin/ip -br addr; } > /host/guest-setup.log 2>&1
if rdma link | grep -q 'rxe0/1 state ACTIVE'; then echo ok > /host/guest-up; else echo fail > /host/guest-up; fi
EOF
  for name in "${SELECTED[@]}"; do
    mkdir -p "$SHARE/s/$name"
    printf '%s\n' "${GUEST[$name]}" > "$SHARE/s/$name/guest.sh"
    echo "run_scenario $name ${TIMEOUT[$name]} ${GRACE[$name]}"
  done
} > "$SHARE/run.sh"

# --- Network namespace, tap device, the guest -----------------------------------------------------
QEMU_PID='' HOST_PID=''
# shellcheck disable=SC2317  # called by the trap
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  [ -z "$HOST_PID" ] || kill -TERM -- "-$HOST_PID" 2>/dev/null || true
  if [ -n "$QEMU_PID" ] && kill -0 "$QEMU_PID" 2>/dev/null; then
    kill -TERM "$QEMU_PID" 2>/dev/null || true
    wait "$QEMU_PID" 2>/dev/null || true
  fi
  ip netns del "$NS" 2>/dev/null || true
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

ip netns add "$NS"
ip -n "$NS" link set lo up
ip -n "$NS" tuntap add dev tap0 mode tap
ip -n "$NS" link set tap0 mtu "$MTU"
ip -n "$NS" addr add "$HOST_IP/24" dev tap0
ip -n "$NS" addr add "$HOST_IP6/64" dev tap0 nodad
ip -n "$NS" link set tap0 up

t=$(now)
NS=$NS CACHE=$CACHE VM_TIMEOUT=$VM_TIMEOUT VM_CPUS=$VM_CPUS VM_MEM=$VM_MEM \
  "$HERE/vm/run-vm-net.sh" "$SHARE" > "$OUT/console.log" 2>&1 &
QEMU_PID=$!

qemu_alive() { kill -0 "$QEMU_PID" 2>/dev/null; }

# wait_for FILE SECS: poll for FILE while the guest is alive.
wait_for() {
  local end=$((SECONDS + $2))
  until [ -e "$1" ]; do
    qemu_alive || return 1
    [ $SECONDS -lt $end ] || return 1
    sleep 0.2
  done
}

if ! wait_for "$SHARE/guest-up" "$BOOT_TIMEOUT" || [ "$(cat "$SHARE/guest-up")" != ok ]; then
  say "guest did not come up ($(since "$t")); console:"
  tail -n 30 "$OUT/console.log" | sed 's/^/    /'
  [ ! -e "$SHARE/guest-setup.log" ] || sed 's/^/    /' "$SHARE/guest-setup.log"
  FAILED=${#SELECTED[@]}
  for name in "${SELECTED[@]}"; do echo "FAIL $name (guest did not boot)"; done
  finish
fi
say "boot: guest up in $(since "$t")"

# --- Host side of one scenario --------------------------------------------------------------------
# Helpers for host_ready= conditions.
# shellcheck disable=SC2317  # called through eval
host_listening() { ip netns exec "$NS" ss -Hltn "sport = :$1" | grep -q .; }
# shellcheck disable=SC2317
host_log_has() { grep -qE "$1" "$SCEN_DIR/host.log"; }

# start_host NAME: the host command in the background, in its own process group, inside the netns.
start_host() {
  setsid env EX="$EX" OUT="$OUT" HOST_IP="$HOST_IP" GUEST_IP="$GUEST_IP" \
    HOST_IP6="$HOST_IP6" GUEST_IP6="$GUEST_IP6" \
    SCEN_DIR="$SCEN_DIR" INTEROP_DIR="$HERE" RUST_BACKTRACE=1 \
    ip netns exec "$NS" timeout -k 5 "${TIMEOUT[$1]}" bash -c "${HOSTCMD[$1]}" \
    > "$SCEN_DIR/host.log" 2>&1 < /dev/null &
  HOST_PID=$!
}

# finish_host: wait for the host command, then kill what it left in its process group; sets host_rc.
finish_host() {
  host_rc=0
  wait "$HOST_PID" || host_rc=$?
  kill -KILL -- "-$HOST_PID" 2>/dev/null || true
  HOST_PID=
}

# expect FILE PATTERNS: every newline-separated ERE in PATTERNS matches a line of FILE.
expect() {
  local re
  [ -n "$2" ] || return 0
  [ -e "$1" ] || { echo "no $(basename "$1")"; return 1; }
  while IFS= read -r re; do
    [ -z "$re" ] || grep -qE -- "$re" "$1" || { echo "no line matches /$re/ in $(basename "$1")"; return 1; }
  done <<<"$2"
}

# run_one NAME: both sides of one scenario; sets WHY to the reason of a failure (empty: passed).
GUEST_ALIVE=1
run_one() {
  local name=$1 role=${ROLE[$1]} limit=$((${TIMEOUT[$1]} + 30)) why='' guest_rc=''
  SCEN_DIR=$SHARE/s/$name
  host_rc=
  case $role in
    host-server)
      start_host "$name"
      local end=$((SECONDS + ${TIMEOUT[$name]}))
      until (eval "${READY[$name]}") >/dev/null 2>&1; do
        if ! kill -0 "$HOST_PID" 2>/dev/null || [ $SECONDS -ge $end ]; then why="host side never got ready"; break; fi
        sleep 0.2
      done
      touch "$SCEN_DIR/go"
      finish_host ;;
    host-client)
      touch "$SCEN_DIR/go"
      local end=$((SECONDS + limit))
      until [ -e "$SCEN_DIR/ready" ] || [ -e "$SCEN_DIR/guest.rc" ]; do
        if ! qemu_alive || [ $SECONDS -ge $end ]; then break; fi
        sleep 0.2
      done
      if [ -e "$SCEN_DIR/ready" ]; then start_host "$name"; finish_host; else why="guest side never got ready"; fi ;;
    guest-only)
      touch "$SCEN_DIR/go" ;;
  esac
  # host-done lets the guest move on; for guest-only it would cut the snippet short (see GRACE).
  [ "$role" = guest-only ] || touch "$SCEN_DIR/host-done"
  if wait_for "$SCEN_DIR/guest.rc" "$limit"; then
    guest_rc=$(cat "$SCEN_DIR/guest.rc")
  else
    GUEST_ALIVE=0
    why=${why:-"no result from the guest within ${limit}s"}
  fi
  touch "$SCEN_DIR/host-done"
  # Collect every reason: the first one is rarely the whole story.
  local -a why_all=()
  [ -z "$why" ] || why_all+=("$why")
  if [ -n "$host_rc" ] && [ "${HOST_RC[$name]}" != any ] && [ "$host_rc" != "${HOST_RC[$name]}" ]; then
    why="host exit status $host_rc, expected ${HOST_RC[$name]}"
    [ "$host_rc" != 124 ] || why+=" (timed out after ${TIMEOUT[$name]} s)"
    why_all+=("$why")
  fi
  if [ -n "$guest_rc" ] && [ "${GUEST_RC[$name]}" != any ] && [ "$guest_rc" != "${GUEST_RC[$name]}" ]; then
    why_all+=("guest exit status $guest_rc, expected ${GUEST_RC[$name]}")
  fi
  if [ ${#why_all[@]} -eq 0 ]; then
    why=$(expect "$SCEN_DIR/guest.log" "${EXPECT_GUEST[$name]}") || why_all+=("$why")
    why=$(expect "$SCEN_DIR/host.log" "${EXPECT_HOST[$name]}") || why_all+=("$why")
  fi
  if [ ${#why_all[@]} -eq 0 ] && [ -n "${CHECK[$name]}" ]; then
    if ! (export EX OUT HOST_IP GUEST_IP SCEN_DIR INTEROP_DIR=$HERE; eval "${CHECK[$name]}") > "$SCEN_DIR/check.log" 2>&1; then
      why_all+=("check failed: ${CHECK[$name]}")
    fi
  fi
  WHY=
  for why in "${why_all[@]}"; do WHY+=${WHY:+; }$why; done
}

show_logs() {
  local f
  for f in guest.log host.log check.log; do
    [ -s "$SCEN_DIR/$f" ] || continue
    echo "    --- $f (last 15 lines of $SCEN_DIR/$f)"
    tail -n 15 "$SCEN_DIR/$f" | sed 's/^/    /'
  done
}

budget_end=$((SECONDS + BUDGET))
for name in "${SELECTED[@]}"; do
  SCEN_DIR=$SHARE/s/$name
  if [ "$GUEST_ALIVE" = 0 ] || [ $SECONDS -ge $budget_end ]; then
    touch "$SCEN_DIR/abort" "$SCEN_DIR/go"
    if [ "$GUEST_ALIVE" = 0 ]; then why="the guest stopped answering"; else why="over the ${BUDGET}s budget"; fi
    echo "FAIL $name (not run: $why)"; FAILED=$((FAILED + 1)); continue
  fi
  t=$(now)
  run_one "$name"
  if [ -z "$WHY" ]; then
    echo "PASS $name ($(since "$t"))"; PASSED=$((PASSED + 1))
  else
    echo "FAIL $name ($(since "$t")): $WHY"; FAILED=$((FAILED + 1))
    show_logs
  fi
done

# The guest powers off after its last scenario.
t=$(now)
end=$((SECONDS + 60))
while qemu_alive && [ $SECONDS -lt $end ]; do sleep 0.2; done
say "shutdown: $(since "$t"); logs in $OUT"
finish
