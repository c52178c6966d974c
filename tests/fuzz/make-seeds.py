#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Write the seed corpora of tests/fuzz/corpus/ (run from the top directory after a wire change).
import re
import struct

WIRE = open('exs/proto/wire.h').read()
VERSION = int(re.search(r'#define EXS_WIRE_VERSION\s+(\d+)u', WIRE).group(1))


def hdr(t, flags=0, syn=0, ln=0, psn=0, raddr=0, rkey=0, imm=0):
    return struct.pack('>IBBBBIIQII', 0x45585354, 1, t, flags, syn, ln, psn, raddr, rkey, imm)


def hello(st, credits=64, ctrl=512, ring=1 << 20, eager=4096):
    return struct.pack('>HBBHHIIQIIIBBH', 0x4558, VERSION, st, 3, credits, ctrl, ring,
                       0x100000000, 0x1234, eager, 0, 0, 0, 0)


def ctrl(t, ln, credits=0):
    return struct.pack('>BBHHH', t, 0, ln, credits, 0)


def put(name, data):
    with open('tests/fuzz/corpus/' + name, 'wb') as f:
        f.write(data)


nop = ctrl(6, 8)
ack = ctrl(1, 16) + struct.pack('>Q', 0)
conn = bytes(8)
t = 'fuzz_tcp_frames/'
put(t + 'handshake-seq', b'\x00' + hdr(1, ln=8 + 40) + conn + hello(2))
put(t + 'handshake-stream', b'\x02' + hdr(1, ln=8 + 40) + conn + hello(1))
put(t + 'send-nop', b'\x01' + hdr(4, ln=8) + nop)
put(t + 'send-ack-write', b'\x01' + hdr(4, ln=16) + ack +
    hdr(5, flags=1, ln=16, psn=1, raddr=0x7f0000000000, rkey=1, imm=0x60000000) + bytes(16))
put(t + 'read-req', b'\x01' + hdr(6, psn=0, raddr=0x7f0000000000, rkey=2, imm=64))
put(t + 'ack-nak', b'\x03' + hdr(8, psn=0) + hdr(9, syn=2, psn=0))
put(t + 'disconnect', b'\x03' + hdr(10))
put(t + 'garbage', b'\x00' + bytes(range(64)))
t = 'fuzz_hello/'
put(t + 'seq', b'\x00' + hello(2))
put(t + 'stream', b'\x01' + hello(1))
put(t + 'stream-ring0', b'\x01' + hello(1, ring=0))
put(t + 'short', b'\x00' + hello(2)[:20])


def send(p):
    return b'\x01' + struct.pack('>H', len(p)) + p


def wwi(imm, off, p):
    return b'\x00' + struct.pack('>IIH', imm, off, len(p)) + p


adv = ctrl(2, 40) + struct.pack('>QIIQII', 0x100000000, 65536, 7, 0, 0, 1)
ann = ctrl(3, 32) + struct.pack('>QIIQ', 0x100000000, 8192, 9, 0)
t = 'fuzz_ctrl/'
put(t + 'seq-nop-ack', b'\x00' + send(nop + ack))
put(t + 'seq-eager', b'\x00' + wwi(0x60000000, 0, b'hello' * 4))
put(t + 'stream-data', b'\x01' + wwi(0x40000000, 0, b'x' * 100) + wwi(0x40010000, 100, b'y' * 50))
put(t + 'seq-advert-announce', b'\x00' + send(adv + ann))
put(t + 'seq-shutdown', b'\x00' + send(ctrl(5, 16) + struct.pack('>Q', 0)))
put(t + 'seq-read-done', b'\x00' + send(ctrl(4, 16) + struct.pack('>Q', 0)))
# STREAM DRAIN (section 7.2): a request after ring data, then an (unsolicited) STOPPED answer
drain = ctrl(8, 24) + struct.pack('>QII', 100, 1, 0)
stopped = struct.pack('>BBHHH', 8, 1, 24, 0, 0) + struct.pack('>QII', 100, 1, 0)
put(t + 'stream-drain', b'\x01' + wwi(0x40000000, 0, b'x' * 100) + send(drain) + send(stopped))
t = 'fuzz_imm/'
put(t + 'eager', struct.pack('<I', 0x60000000))
put(t + 'direct', struct.pack('<I', 0x2003abcd) + bytes([1, 0, 5, 0x12, 0x34, 1]))
