#!/usr/bin/env python3
"""A stand-in for an ibv_rc_pingpong server that has no RDMA at all, for harness sanity checks.

  fake_rc_peer.py serve QPN PSN GID_HEX   do ibv_rc_pingpong's TCP exchange on port 18515 as the
                                          server, advertising QPN/PSN/GID, then exit
  fake_rc_peer.py pcap FILE QPN           print the BTH of every RoCEv2 packet in FILE sent to QPN;
                                          exit 1 if there is none

The exchange is rdma-core's (libibverbs/examples/rc_pingpong.c): the client sends
"LID:QPN:PSN:GID" as "%04x:%06x:%06x:%s" plus a NUL (52 bytes), the server answers in kind, and the
client ends with "done\\0". The GID is the 16 GID bytes in hex, in wire order.
"""
import socket
import struct
import sys

MSG_LEN = len("0000:000000:000000:00000000000000000000000000000000") + 1


def recv_exact(conn, n):
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            raise SystemExit(f"peer closed after {len(buf)} of {n} bytes")
        buf += chunk
    return buf


def serve(qpn, psn, gid):
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", 18515))
    srv.listen(1)
    print("fake peer: listening on 18515", flush=True)
    conn, addr = srv.accept()
    theirs = recv_exact(conn, MSG_LEN).rstrip(b"\0").decode()
    lid, rqpn, rpsn, rgid = theirs.split(":")
    print(f"fake peer: client {addr[0]} LID {lid} QPN {rqpn} PSN {rpsn} GID {rgid}", flush=True)
    ours = f"{0:04x}:{qpn:06x}:{psn:06x}:{gid}".encode() + b"\0"
    assert len(ours) == MSG_LEN
    conn.sendall(ours)
    done = recv_exact(conn, 5).rstrip(b"\0").decode()
    print(f"fake peer: client said {done!r}", flush=True)


def pcap(path, qpn):
    with open(path, "rb") as f:
        data = f.read()
    magic = struct.unpack_from("<I", data)[0]
    endian = "<" if magic in (0xA1B2C3D4, 0xA1B23C4D) else ">"
    off, hits = 24, 0
    while off + 16 <= len(data):
        _, _, incl, _ = struct.unpack_from(endian + "IIII", data, off)
        frame = data[off + 16 : off + 16 + incl]
        off += 16 + incl
        if len(frame) < 14 + 20 + 8 + 12 or frame[12:14] != b"\x08\x00":
            continue
        ihl = (frame[14] & 0x0F) * 4
        udp = 14 + ihl
        if frame[14 + 9] != 17 or struct.unpack_from(">H", frame, udp + 2)[0] != 4791:
            continue
        bth = frame[udp + 8 : udp + 20]
        opcode, dqpn, apsn = bth[0], int.from_bytes(bth[5:8], "big"), int.from_bytes(bth[8:12], "big")
        if dqpn == qpn:
            hits += 1
            src = ".".join(str(b) for b in frame[26:30])
            print(f"{src} -> QPN {dqpn:#08x} opcode {opcode:#04x} PSN {apsn & 0xFFFFFF:#08x} "
                  f"ackreq {apsn >> 31} len {len(frame)}")
    if hits == 0:
        raise SystemExit(f"no RoCEv2 packet to QPN {qpn:#x} in {path}")


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "serve":
        serve(int(sys.argv[2], 0), int(sys.argv[3], 0), sys.argv[4])
    elif len(sys.argv) == 4 and sys.argv[1] == "pcap":
        pcap(sys.argv[2], int(sys.argv[3], 0))
    else:
        raise SystemExit(__doc__)
