# Sourced by the generated /host/run.sh inside the guest (busybox sh, not bash).
# Protocol with the host, per scenario, through files in /host/s/NAME/ (the 9p share):
#   host  -> go         the host side is ready (a host server is listening): run the guest snippet
#   guest -> ready      written by the snippet's `ready` (a guest server is listening)
#   guest -> guest.rc   the snippet's exit status (after guest.log is complete)
#   host  -> host-done  the host command has finished: the snippet gets GRACE more seconds, then the
#                       guest moves on to the next scenario (for guest-only: after guest.rc)
# Every wait has a deadline, so a dead host (or a hung tool) costs time but never hangs the guest.

# Line-buffered stdout for every dynamically linked tool (as `stdbuf -oL` does): a tool killed by a
# timeout still leaves what it printed in guest.log.
if [ -e /usr/libexec/coreutils/libstdbuf.so ]; then
  export LD_PRELOAD=/usr/libexec/coreutils/libstdbuf.so _STDBUF_O=L
fi

# wait_file PATH SECS: poll until PATH exists; fails after SECS seconds.
wait_file() {
  _end=$(( $(date +%s) + $2 ))
  while [ ! -e "$1" ]; do
    [ "$(date +%s)" -ge "$_end" ] && return 1
    sleep 0.2
  done
}

# wait_listen PORT [SECS]: wait until something listens on TCP PORT (IPv4 or IPv6) in the guest.
wait_listen() {
  _hex=$(printf ':%04X ' "$1")
  _end=$(( $(date +%s) + ${2:-60} ))
  until cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | awk '$4 == "0A" { print $2 " " }' | grep -q "$_hex"; do
    [ "$(date +%s)" -ge "$_end" ] && { echo "wait_listen: nothing listens on $1"; return 1; }
    sleep 0.2
  done
}

# ready: tell the host that the guest side of this scenario is listening.
ready() { touch "$SCEN_DIR/ready"; }

# host_done: true once the host command of this scenario has finished.
host_done() { [ -e "$SCEN_DIR/host-done" ]; }

# until_host_done CMD...: run CMD until it exits or the host command has finished, whichever is first.
# Returns CMD's status, or 0 if it was stopped because the host was done.
until_host_done() {
  "$@" & _pid=$!
  while kill -0 "$_pid" 2>/dev/null && ! host_done; do sleep 0.5; done
  if host_done && kill -0 "$_pid" 2>/dev/null; then kill "$_pid" 2>/dev/null; wait "$_pid"; return 0; fi
  wait "$_pid"
}

# run_scenario NAME SECS GRACE: one scenario, guest side. The snippet runs in its own session so that
# anything it leaves behind (a server that never got its client) dies with its process group. It is
# killed after SECS seconds, or GRACE seconds after the host side finished (a host that failed early
# must not cost the guest its whole timeout).
run_scenario() {
  SCEN_DIR=/host/s/$1; export SCEN_DIR
  if ! wait_file "$SCEN_DIR/go" "$2"; then echo "=== $1: no go from the host"; return; fi
  if [ -e "$SCEN_DIR/abort" ]; then echo "=== $1: aborted by the host"; return; fi
  echo "=== $1: start $(date +%T)"
  # shellcheck disable=SC2016  # expanded by the inner sh
  setsid sh -c '. /host/guest-lib.sh; . "$SCEN_DIR/guest.sh"' > "$SCEN_DIR/guest.log" 2>&1 &
  _pid=$!
  _now=$(date +%s); _end=$((_now + $2)); _grace=
  while kill -0 "$_pid" 2>/dev/null; do
    _now=$(date +%s)
    if [ "$_now" -ge "$_end" ]; then echo "=== guest: killed after the $2 s timeout" >> "$SCEN_DIR/guest.log"; break; fi
    if [ -z "$_grace" ] && host_done; then _grace=$((_now + $3)); fi
    if [ -n "$_grace" ] && [ "$_now" -ge "$_grace" ]; then
      echo "=== guest: killed $3 s after the host side finished" >> "$SCEN_DIR/guest.log"; break
    fi
    sleep 0.2
  done
  kill -KILL -- "-$_pid" 2>/dev/null
  wait "$_pid"; _rc=$?
  echo "$_rc" > "$SCEN_DIR/guest.rc.tmp"; mv "$SCEN_DIR/guest.rc.tmp" "$SCEN_DIR/guest.rc"
  echo "=== $1: guest rc $_rc $(date +%T)"
  wait_file "$SCEN_DIR/host-done" "$2" || echo "=== $1: host did not finish"
}

# gid_index GID: the index of GID (as sysfs prints it, e.g. fd77:0000:...:0002) in rxe0's GID
# table (rxe lists each of eth0's addresses as a RoCE v2 GID; empty entries fail to read).
gid_index() {
  grep -lx "$1" /sys/class/infiniband/rxe0/ports/1/gids/* 2>/dev/null | head -n 1 | sed 's,.*/,,'
}
