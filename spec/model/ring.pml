/* SPDX-License-Identifier: MIT */
/* A Spin model of STREAM ring autotuning (spec/protocol.md §7.4): the ring switch (RESIZE offer, SWITCHED answer, retirement) delivers every ring byte exactly once, in order. */

/*
 * The writer (the data sender) puts N ring bytes into the owner's ring, one write of 1
 * or 2 bytes at a time, in order, over one FIFO channel that also carries its control
 * records (RC: writes and SENDs arrive in posting order). The owner (the data receiver)
 * copies bytes out one at a time, reports consumption in ACKs, and at any time offers a
 * new region of 1 to 3 slots (at most SWITCHES times); the writer answers SWITCHED at
 * its tail and writes the next bytes into the new region. A byte's value is its
 * position, so a byte read from the wrong region, a stale slot or an overwritten one
 * fails the assertion in the copy-out. Regions: 0 is the initial one (RING0 slots).
 *
 * Checked (safety, every interleaving): every byte copied out has the value of its
 * position (exactly once, in order, nothing overwritten before it was consumed); no
 * write reaches a region whose key was revoked or that was freed; no write overruns
 * the region it lands in; SWITCHED names exactly the positions arrived. End states:
 * both processes finish with all N bytes consumed (no deadlock).
 *
 * Broken variants (must fail): BROKEN_FREE_EARLY frees the old region at SWITCHED
 * without waiting for its bytes to be consumed; BROKEN_ANSWER_LATE lets the writer use
 * the new region for one write before its SWITCHED leaves; BROKEN_ROOM_NEW_ONLY lets the
 * writer count only the bytes written into the new region against its size;
 * BROKEN_NO_ANSWER never answers an offer (the checker finds the offer left open).
 * spec/model/run.sh runs the configurations named ring_*.
 */

#ifndef N
#define N 6
#endif
#ifndef RING0
#define RING0 2
#endif
#ifndef SWITCHES
#define SWITCHES 2
#endif
#define REGIONS (SWITCHES + 1)
#define SLOTS 3 /* the largest region */
#define POISON 255

mtype = { WRITE, SWITCHED, OFFER, ACK };

chan w2o = [N + SWITCHES] of { mtype, byte, byte, byte }; /* WRITE(region, pos, len), SWITCHED(pos, size) */
chan o2w = [N + SWITCHES + 2] of { mtype, byte, byte, byte }; /* OFFER(region, size), ACK(consumed) */

byte mem[REGIONS * SLOTS] = POISON;
bool revoked[REGIONS]; /* the writer's key to the region was revoked */
bool freed[REGIONS];
byte rsize[REGIONS] = RING0; /* [0]: the initial ring; the others are set by their offer */
byte consumed = 0; /* the owner's */
bool offered = false;

#ifdef BROKEN_ROOM_NEW_ONLY
#define USED (tail - (wcons > base -> wcons : base))
#else
#define USED (tail - wcons)
#endif
#ifdef BROKEN_ANSWER_LATE
#define MAY_WRITE true
#else
#define MAY_WRITE (!owed)
#endif

active proctype writer() {
    byte tail = 0, wcons = 0, reg = 0, size = RING0, ln, m;
    byte nreg, nsize, a, b;
    bool owed = false;
    byte base = 0;

end_w:
    do
    :: o2w?ACK(a, b, m) -> wcons = a
    :: o2w?OFFER(a, b, m) ->
        assert(!owed);
        owed = true; nreg = a; nsize = b
#ifdef BROKEN_ANSWER_LATE
        ; reg = nreg; size = nsize /* switches, answers later */
#endif
#ifndef BROKEN_NO_ANSWER
    :: atomic { owed ->
        w2o!SWITCHED(tail, nsize, 0);
        reg = nreg; size = nsize; owed = false; base = tail
      }
#endif
    :: atomic { MAY_WRITE && tail < N && USED < size ->
        /* 1 or 2 bytes, not past the region's end, nor the room, nor the stream */
        ln = size - tail % size;
        if
        :: ln > size - USED -> ln = size - USED
        :: else
        fi;
        if
        :: ln > N - tail -> ln = N - tail
        :: else
        fi;
        if
        :: ln > 1 -> ln = 1
        :: ln > 1 -> ln = 2
        :: ln == 1
        fi;
        w2o!WRITE(reg, tail, ln);
        tail = tail + ln
      }
    od
}

inline retire() {
    freed[old] = true; hasold = false;
    i = 0;
    do
    :: i < SLOTS -> mem[old * SLOTS + i] = POISON; i++
    :: else -> break
    od
}

active proctype owner() {
    byte arrived = 0, acked = 0, cur = 0, next = 1, old = 0, oldend = 0, i, v, reg;
    byte p, l, s;
    bool hasold = false;

end_o:
    do
    :: w2o?WRITE(reg, p, l) ->
        atomic {
            assert(p == arrived);
            assert(reg == cur && !revoked[reg] && !freed[reg]);
            /* the room rule: positions arrived but not consumed fit the current region */
            assert(arrived + l - consumed <= rsize[cur]);
            i = 0;
            do
            :: i < l -> mem[reg * SLOTS + (p + i) % rsize[reg]] = p + i; i++
            :: else -> break
            od;
            arrived = arrived + l
        }
    :: w2o?SWITCHED(p, s, l) ->
        atomic {
            assert(offered && s == rsize[next - 1] && p == arrived);
            revoked[cur] = true; /* at once */
            old = cur; oldend = p; hasold = true;
            cur = next - 1; offered = false;
#ifdef BROKEN_FREE_EARLY
            retire();
#endif
            if
            :: hasold && consumed >= oldend -> retire()
            :: else
            fi
        }
    :: atomic { consumed < arrived ->
        /* position consumed lives in the old region while below its end */
        if
        :: hasold && consumed < oldend -> reg = old
        :: else -> reg = cur
        fi;
        v = mem[reg * SLOTS + consumed % rsize[reg]];
        assert(v == consumed);
        mem[reg * SLOTS + consumed % rsize[reg]] = POISON;
        consumed++;
        if
        :: hasold && consumed >= oldend -> retire()
        :: else
        fi
      }
    :: atomic { acked != consumed -> o2w!ACK(consumed, 0, 0); acked = consumed }
    :: atomic { !offered && !hasold && next < REGIONS ->
        if
        :: rsize[next] = 1
        :: rsize[next] = 2
        :: rsize[next] = 3
        fi;
        o2w!OFFER(next, rsize[next], 0);
        next++; offered = true
      }
    od
}

/* Once nothing can move: every byte was consumed and no offer is left unanswered. */
active proctype checker() {
    timeout -> assert(consumed == N && !offered)
}
