#!/bin/sh
# Seed the fuzz corpora from the golden captures: every frame of rxe-basic.pcap for `packet`
# (as a whole frame and as its UDP payload), and the first 2 KB of it for `pcap`.
set -e
cd "$(dirname "$0")"
mkdir -p corpus/packet corpus/pcap
python3 - <<'PY'
import struct
d = open('../tests/data/rxe-basic.pcap', 'rb').read()
off, n = 24, 0
while off + 16 <= len(d):
    incl = struct.unpack('<I', d[off + 8:off + 12])[0]
    f = d[off + 16:off + 16 + incl]
    off += 16 + incl
    n += 1
    open('corpus/packet/frame%03d' % n, 'wb').write(f)
    open('corpus/packet/udp%03d' % n, 'wb').write(f[42:])
open('corpus/pcap/basic-head', 'wb').write(d[:2048])
PY
