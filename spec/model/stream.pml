/*
 * SPDX-License-Identifier: MIT
 *
 * stream.pml: Promela model of the SOCK_STREAM dynamic direct / indirect
 * algorithm of spec/protocol.md section 7 (UNH EXS, seed 004, Fig. 2-5).
 * spec/model/README.md explains the model; spec/model/run.sh checks it.
 *
 * One sender, one receiver, two FIFO channels:
 *   ctl  receiver -> sender: ADVERT records and ACKs (ring space returned)
 *   data sender -> receiver: DIRECT / INDIRECT transfers, then END
 * Bytes are named by their stream offset: every transfer carries the offset
 * of its first byte, so the receiver can check that each byte reaches the
 * right receive, once, in order.
 *
 * Configuration (all -D macros, defaults below):
 *   SEND0..SEND2          lengths of the three sends
 *   RECV0..RECV2, WAIT0..WAIT2
 *                         lengths and MSG_WAITALL flags of the three receives
 *   XLEN                  length of the receives the application keeps posting,
 *                         one at a time, after its list until it sees the end
 *   RING                  ring capacity in bytes
 *   RESYNC                the receiver sets S'_r = S_r when it starts a new
 *                         direct phase (not in section 7, see README)
 *   RESYNC_FIG5           the other repair: a copy into a receive that was
 *                         never advertised also adds l_c to S'_r
 *   CHECK_RESYNC          assert that S'_r == S_r whenever a new direct phase
 *                         starts (the first ADVERT of a sequence is exact)
 *   DRIFT_PROBE           assert that the sender never returns to direct
 *                         transfers once a direct phase started with
 *                         S'_r != S_r (holds under section 7 as written:
 *                         the connection stays indirect for good; a trail
 *                         with RESYNC is a witness that the fix recovers)
 *   NO_EXACT_CHECK        drop the sender-side assertion S_A == S_s on a
 *                         resynchronisation (so that broken variants show
 *                         the misdirected write at the receiver)
 *   IMPL_RULE             the receiver's advertising rule of the C code
 *                         (exs/proto/stream.c st_advertise_locked) instead of
 *                         Fig. 3 at posting: walk the unsatisfied receives in
 *                         order; a prior-phase ADVERT stops the walk; the first
 *                         receive without an ADVERT is advertised iff b_r == 0
 *                         and it holds no bytes yet (it does not count in k_b
 *                         itself), and so are the ones after it; S'_r = S_r
 *                         first when no ADVERT is outstanding. Re-evaluated
 *                         after every receiver step (post, arrival, copy-out).
 *   IMPL_LAZY             with IMPL_RULE: the re-evaluation may be deferred
 *                         past later events (the C code defers an ADVERT when
 *                         its control buffer is full and no credit is left)
 *   LATE_ADVERT_PROBE     with IMPL_RULE: assert that no DIRECT lands in a
 *                         receive that was posted without an ADVERT (a trail
 *                         is a witness that late ADVERTs are used)
 *   ADVERT_MIN=n          with IMPL_RULE: receives shorter than n bytes are not
 *                         advertised (small receives stay indirect, section 7.3),
 *                         except the first after a drain
 *   BROKEN_SMALL_AFTER_DRAIN  with ADVERT_MIN and DRAIN: not even after a drain
 *                         (the held sender then waits for an ADVERT forever)
 *   BROKEN_SMALL_DIRECT_PEER  with ADVERT_MIN and TX_DIRECT_ONLY: small receives
 *                         are not advertised to a direct-only sender either
 *   DRAIN                 with IMPL_RULE: the return to direct of section 7.2.
 *                         The receiver may send DRAIN(pos, phase) at any moment
 *                         the C rule allows it (indirect phase, no request yet,
 *                         before END; the streak and size heuristics only pick
 *                         some of these moments); the
 *                         sender drops the stale ADVERTs before it, holds the
 *                         ring and answers STOPPED(S_s, P_s) on a channel of its
 *                         own (not ordered with the data); the receiver sends
 *                         no ADVERT until S_r reaches that position with the
 *                         ring empty, and then may advertise the rest of a
 *                         WAITALL receive partly filled from the ring, and
 *                         advertises again the receives whose ADVERT was of an
 *                         earlier phase (k_a: stale at the sender). The C
 *                         code's checks of both records are assertions here:
 *                         an honest peer never trips them.
 *   TX_DIRECT_ONLY        the sender's mode is direct-only: it never writes the
 *                         ring (unless the receiver is indirect-only)
 *   RX_INDIRECT_ONLY      the receiver's mode is indirect-only: it never
 *                         advertises nor drains (a direct-only receiver behaves
 *                         as a dynamic one, so do both sender modes but
 *                         direct-only: every pairing is one of these)
 *   DRAIN_WITNESS         with DRAIN: assert that a held sender never goes direct
 *                         (a trail is a witness that DRAIN leads back to direct)
 *   BROKEN_DRAIN_NO_READVERT  with DRAIN: after the drain the receiver does not
 *                         advertise again receives of an earlier phase (k_a)
 *   BROKEN_DRAIN_NO_HOLD  with DRAIN: the sender answers but keeps writing the ring
 *   BROKEN_ADVERT_WHILE_RING_NONEMPTY  receiver ignores b_r > 0 (Fig. 3 line 1;
 *                                      turns out not to matter for safety)
 *   BROKEN_IGNORE_PRIOR_ADVERTS        receiver ignores k_a > 0 (Fig. 6)
 *   BROKEN_IGNORE_UNADVERTISED         receiver ignores k_b > 0
 *   BROKEN_NO_PHASE_JUMP               sender does not move past a stale
 *                                      ADVERT's phase (Fig. 8)
 */

#ifndef RING
#define RING 2
#endif
#ifndef SEND0
#define SEND0 1
#endif
#ifndef SEND1
#define SEND1 2
#endif
#ifndef SEND2
#define SEND2 1
#endif
#ifndef RECV0
#define RECV0 2
#endif
#ifndef RECV1
#define RECV1 1
#endif
#ifndef RECV2
#define RECV2 2
#endif
#ifndef WAIT0
#define WAIT0 0
#endif
#ifndef WAIT1
#define WAIT1 0
#endif
#ifndef WAIT2
#define WAIT2 0
#endif
#ifndef XLEN
#define XLEN 2
#endif

#define NSEND 3
#define NRECV 3
#define TOTAL (SEND0 + SEND1 + SEND2)
#define SLEN(i) ((i) == 0 -> SEND0 : ((i) == 1 -> SEND1 : ((i) == 2 -> SEND2 : 0)))
#define RLEN(i) ((i) == 0 -> RECV0 : ((i) == 1 -> RECV1 : RECV2))
#define RWAIT(i) ((i) == 0 -> WAIT0 : ((i) == 1 -> WAIT1 : WAIT2))

#define IS_DIRECT(p)   ((p) % 2 == 0)
#define IS_INDIRECT(p) ((p) % 2 == 1)
#define MIN(a, b) ((a) < (b) -> (a) : (b))

/* Capacities large enough never to block a send (asserted before each):
 * at most one ACK per byte and one ADVERT per receive travel to the sender,
 * at most one transfer per byte plus END to the receiver. */
#define CTLCAP  (2 * TOTAL + NRECV + 1)
#define DATACAP (TOTAL + 1)
#define QACAP   (TOTAL + NRECV + 1)   /* ADVERTs the sender holds */
#define RQ      4   /* unsatisfied receives the receiver holds */

/* receive advert state */
#define NONE  0     /* never advertised: counted in k_b */
#define CUR   1     /* advertised in the current direct phase */
#define PRIOR 2     /* advertised in an earlier phase: counted in k_a */

mtype = { ADVERT, ACK, DIRECT, INDIRECT, END, DRAIN_REQ };

/* kind, S_A (ACK: bytes freed), P_A, length, MSG_WAITALL, advert id */
chan ctl = [CTLCAP] of { mtype, byte, byte, byte, bit, byte };
/* kind, advert id (DIRECT), offset of the first byte (END: total), length */
chan data = [DATACAP] of { mtype, byte, byte, byte };
#ifdef DRAIN
/* STOPPED answers, sender -> receiver: position, phase (at most one per request,
 * one request per indirect phase, phases bounded by the transfers) */
chan stp = [TOTAL + 1] of { byte, byte };
#endif
#ifdef RX_INDIRECT_ONLY
#define RX_ADVERTISES 0
#else
#define RX_ADVERTISES 1
#endif
#ifdef BROKEN_DRAIN_NO_HOLD
#define RING_FREE(h) 1
#else
#define RING_FREE(h) (!(h))
#endif
#ifdef BROKEN_DRAIN_NO_READVERT
#define REDO_PRIOR 0
#else
#define REDO_PRIOR 1
#endif
#if defined(TX_DIRECT_ONLY) && !defined(RX_INDIRECT_ONLY)
#define TX_MAY_RING 0
#else
#define TX_MAY_RING 1
#endif

/* observable for claims and for the README statistics */
#ifdef DRIFT_PROBE
bit drifted = 0;    /* a direct phase started with S'_r != S_r */
#endif
byte n_direct = 0, n_indirect = 0, n_stale = 0;

#ifdef DRAIN
/* Section 7.2, the sender's side of a request DRAIN(x1 = pos, x2 = phase), inside
 * the step that took it off ctl: the ADVERTs before it are examined first (stale
 * ones dropped, as st_advert_head), then the C code's checks must hold. */
inline sender_on_drain()
{
    atomic {
        do
        :: nempty(qA) ->
            qA?<aS, aP, alen, aw, aid>;
            if
            :: IS_INDIRECT(P_s) && (aP < P_s || aS < S_s) ->
                if
                :: aP > P_s -> P_s = aP + 1; held = 0
                :: else -> skip
                fi;
                qA?_, _, _, _, _;
                n_stale++
            :: else -> break
            fi
        :: empty(qA) -> break
        od;
        assert(IS_INDIRECT(x2) && x2 == P_s && x1 <= S_s && !held);
        held = 1;
        printf("MSC: S holds the ring at %d in phase %d (DRAIN at %d)\n", S_s, P_s, x1);
        assert(nfull(stp));
        stp!S_s, P_s
    }
}
#endif

proctype Sender()
{
    byte i = 0;             /* send at the head of the queue */
    byte left = SEND0;      /* bytes of it not yet written */
    byte S_s = 0;           /* offset of the next byte to send */
    byte P_s = 0;           /* phase */
    byte b_s = RING;        /* ring space believed free */
    byte tail = 0;          /* ring write position, for the contiguity limit */
    byte fill = 0;          /* bytes already written into the head ADVERT */
    chan qA = [QACAP] of { byte, byte, byte, bit, byte };  /* S_A, P_A, rlen, waitall, id */
    byte aS, aP, alen, aid, lw, x1, x2, x3, x5;
    bit aw, x4, used;
    bit held = 0;           /* section 7.2: a DRAIN holds the ring in phase P_s */
    mtype k;

    do
    :: ctl?k, x1, x2, x3, x4, x5 ->
        if
        :: k == ADVERT -> assert(nfull(qA)); qA!x1, x2, x3, x4, x5
        :: k == ACK -> b_s = b_s + x1; assert(b_s <= RING)
#ifdef DRAIN
        :: k == DRAIN_REQ -> sender_on_drain()
#endif
        fi
    :: i < NSEND && (nempty(qA) || (b_s > 0 && RING_FREE(held) && TX_MAY_RING)) ->
        atomic {
            used = 0;
            /* Fig. 2 lines 1-16: the ADVERTs, oldest first */
            do
            :: nempty(qA) ->
                qA?<aS, aP, alen, aw, aid>;
                if
                :: IS_INDIRECT(P_s) && (aP < P_s || aS < S_s) ->
                    /* stale: drop it, and move past its phase */
#ifndef BROKEN_NO_PHASE_JUMP
                    if
                    :: aP > P_s -> P_s = aP + 1; held = 0
                    :: else -> skip
                    fi;
#endif
                    assert(fill == 0);
                    qA?_, _, _, _, _;
                    printf("MSC: S drops stale ADVERT %d (S_A %d, P_A %d), P_s now %d\n", aid, aS, aP, P_s);
                    n_stale++
                :: else ->
                    if
                    :: IS_INDIRECT(P_s) ->
#ifndef NO_EXACT_CHECK
                        /* resynchronisation: the proof says this ADVERT is
                         * the receiver's head, so it must be exact */
                        assert(aS == S_s && fill == 0);
#endif
#ifdef DRIFT_PROBE
                        /* witness: a return to direct transfers after the
                         * estimate drifted */
                        assert(!drifted);
#endif
#ifdef DRAIN_WITNESS
                        assert(!held);
#endif
                        P_s = aP;
                        held = 0
                    :: else -> skip
                    fi;
                    lw = MIN(left, alen - fill);
                    assert(lw > 0);
                    assert(nfull(data));
                    data!DIRECT, aid, S_s, lw;
                    printf("MSC: S DIRECT via ADVERT %d (S_A %d, P_A %d): bytes %d+%d, P_s %d\n", aid, aS, aP, S_s, lw, P_s);
                    n_direct++;
                    S_s = S_s + lw;
                    left = left - lw;
                    fill = fill + lw;
                    if
                    :: !aw || fill == alen -> qA?_, _, _, _, _; fill = 0
                    :: else -> skip     /* WAITALL, not full: stays at the head */
                    fi;
                    used = 1;
                    break
                fi
            :: empty(qA) -> break
            od;
            /* Fig. 2 lines 17-25: the ring */
            if
            :: !used && b_s > 0 && TX_MAY_RING && RING_FREE(held) ->
                if
                :: IS_DIRECT(P_s) -> P_s = P_s + 1
                :: else -> skip
                fi;
                lw = MIN(left, MIN(b_s, RING - tail));
                assert(nfull(data));
                data!INDIRECT, 0, S_s, lw;
                printf("MSC: S INDIRECT bytes %d+%d, P_s %d\n", S_s, lw, P_s);
                n_indirect++;
                S_s = S_s + lw;
                left = left - lw;
                b_s = b_s - lw;
                tail = (tail + lw) % RING
            :: else -> skip     /* only stale ADVERTs and no ring space: wait */
            fi;
            if
            :: left == 0 -> i++; left = SLEN(i)
            :: else -> skip
            fi
        }
    :: i == NSEND ->
        assert(S_s == TOTAL);
        assert(nfull(data));
        data!END, 0, S_s, 0;
        break
    od;
    /* all sent: keep taking ADVERTs and ACKs so the receiver never blocks */
end_drain:
    do
#ifdef DRAIN
    :: ctl?k, x1, x2, x3, x4, x5 ->
        if
        /* the C sender keeps queueing ADVERTs, so a late DRAIN sees them */
        :: k == ADVERT -> assert(nfull(qA)); qA!x1, x2, x3, x4, x5
        :: k == DRAIN_REQ -> sender_on_drain()
        :: else -> skip
        fi
#else
    :: ctl?_, _, _, _, _, _
#endif
    od
}

#ifdef IMPL_RULE
/* ADVERT_MIN: receives shorter than this are not advertised (they stay indirect), except
 * the first one after a drain (7.2), whose sender waits for an ADVERT. */
#ifdef ADVERT_MIN
#define SMALL_RULE
#else
#define ADVERT_MIN 0
#endif
/* a direct-only sender never writes the ring: every receive is advertised to it */
#if defined(TX_DIRECT_ONLY) && !defined(BROKEN_SMALL_DIRECT_PEER)
#define SMALL_MIN 0
#else
#define SMALL_MIN ADVERT_MIN
#endif
#ifdef BROKEN_SMALL_AFTER_DRAIN
#define SMALL_DRAINED(d) 0
#else
#define SMALL_DRAINED(d) (d)
#endif
/* The C receiver's rule (st_advertise_locked), run inside the caller's atomic
 * step. q_adv PRIOR is "ADVERTISED with phase != P_r", CUR "ADVERTISED with
 * phase == P_r", NONE "no ADVERT yet"; satisfied receives left the queue. */
inline impl_advertise()
{
    j = 0; outst = 0; stop = !RX_ADVERTISES; drained = 0; redo = 0;
#ifdef DRAIN
    if
    :: dr == 1 -> stop = 1      /* no ADVERT before the sender's answer */
    :: dr == 2 && (S_r != dpos || b_r > 0) -> stop = 1
    :: dr == 2 && S_r == dpos && b_r == 0 -> drained = 1; redo = REDO_PRIOR
    :: dr == 0 -> skip
    fi;
#endif
    do
    :: j < qn && !stop && !eos ->
        h = (qh + j) % RQ;
        if
        :: q_adv[h] == PRIOR && !redo -> stop = 1     /* k_a > 0 */
        :: q_adv[h] == CUR -> outst = 1      /* current phase: keep going */
        :: (q_adv[h] == NONE || (q_adv[h] == PRIOR && redo)) && (b_r > 0 || (q_got[h] > 0 && !drained)) -> stop = 1
        :: (q_adv[h] == NONE || (q_adv[h] == PRIOR && redo)) && b_r == 0 && (q_got[h] == 0 || drained) &&
           q_len[h] - q_got[h] < SMALL_MIN && !SMALL_DRAINED(drained) -> stop = 1  /* small: stays indirect */
        :: (q_adv[h] == NONE || (q_adv[h] == PRIOR && redo)) && b_r == 0 && (q_got[h] == 0 || drained) &&
           (q_len[h] - q_got[h] >= SMALL_MIN || SMALL_DRAINED(drained)) ->
            if
            :: IS_INDIRECT(P_r) ->
                P_r = P_r + 1;
#ifdef DRAIN
                dr = 0;
#endif
#ifdef DRIFT_PROBE
                if
                :: S2_r != S_r -> drifted = 1
                :: else -> skip
                fi;
#endif
                skip
            :: else -> skip
            fi;
            if
            :: !outst -> S2_r = S_r         /* resynchronise */
            :: else -> skip
            fi;
            assert(nfull(ctl));
            /* the rest of the receive (all of it unless a drain let a
             * partly filled WAITALL receive be advertised) */
            ctl!ADVERT, S2_r, P_r, q_len[h] - q_got[h], q_w[h], q_id[h];
            printf("MSC: R advertises receive %d (len %d, got %d, waitall %d, late %d): ADVERT S_A %d P_A %d (S_r %d)\n", q_id[h], q_len[h], q_got[h], q_w[h], q_late[h], S2_r, P_r, S_r);
            if
            :: q_w[h] -> S2_r = S2_r + q_len[h] - q_got[h]
            :: else -> S2_r = S2_r + 1
            fi;
            drained = 0;
            if
            :: q_adv[h] == PRIOR -> k_a--    /* advertised again after a drain */
            :: else -> k_b--
            fi;
            q_adv[h] = CUR;
            outst = 1
        fi;
        j++
    :: else -> break
    od
}
#ifdef IMPL_LAZY
#define IMPL_KICK adv_pending = 1
#else
#define IMPL_KICK impl_advertise()
#endif
#endif

proctype Receiver()
{
    byte posted = 0;        /* receives posted; also the next advert id */
    byte S_r = 0;           /* offset of the next byte to hand to a receive */
    byte S2_r = 0;          /* S'_r: offset for the next ADVERT */
    byte P_r = 0;           /* phase */
    byte b_r = 0;           /* ring bytes not yet copied out */
    byte ring_start = 0;    /* offset of the first byte in the ring */
    byte k_a = 0, k_b = 0;
    byte arrived = 0;       /* bytes that arrived, direct or indirect */
    bit eos = 0;            /* END arrived */
    /* unsatisfied receives, oldest at qh */
    byte q_len[RQ], q_got[RQ], q_id[RQ], q_adv[RQ];
    bit q_w[RQ];
    byte qh = 0, qn = 0;
    byte h, j, n, id, S, lw, lc, rlen;
    bit w;
#ifdef IMPL_RULE
    bit outst, stop;        /* impl_advertise(): an ADVERT is outstanding; walk ends */
    bit drained;            /* impl_advertise(): the ring stopped and drained (7.2) */
    bit redo;               /* impl_advertise(): so prior-phase receives are advertised again */
#ifdef DRAIN
    byte dr = 0;            /* 7.2: 0 IDLE, 1 REQUESTED, 2 STOPPED */
    byte dpos = 0, dph;     /* STOPPED: the sender's position; its phase */
#endif
    bit q_late[RQ];         /* posted without an ADVERT (for LATE_ADVERT_PROBE) */
#ifdef IMPL_LAZY
    bit adv_pending = 0;    /* something changed since the last evaluation */
#endif
#endif

    do
    /* the application posts its next receive (fixed list, then one at a
     * time until it sees the end of the stream) */
    :: posted < NRECV || (qn == 0 && !(eos && S_r == arrived)) ->
        atomic {
            if
            :: posted < NRECV -> rlen = RLEN(posted); w = RWAIT(posted)
            :: else -> rlen = XLEN; w = 0
            fi;
            assert(qn < RQ);
            h = (qh + qn) % RQ;
            q_len[h] = rlen; q_w[h] = w; q_got[h] = 0; q_id[h] = posted;
            posted++;
            qn++;
#ifdef IMPL_RULE
            q_adv[h] = NONE;
            k_b++;
            q_late[h] = 0;
            printf("MSC: R posts receive %d (len %d, waitall %d)\n", q_id[h], rlen, w);
            n = h;                  /* impl_advertise() uses h */
            IMPL_KICK;
            q_late[n] = (q_adv[n] == NONE)
#else
            /* Fig. 3 */
            if
            :: RX_ADVERTISES && (b_r == 0
#ifdef BROKEN_ADVERT_WHILE_RING_NONEMPTY
                 || 1
#endif
               ) && (k_a == 0
#ifdef BROKEN_IGNORE_PRIOR_ADVERTS
                 || 1
#endif
               ) && (k_b == 0
#ifdef BROKEN_IGNORE_UNADVERTISED
                 || 1
#endif
               ) ->
                if
                :: IS_INDIRECT(P_r) ->
                    P_r = P_r + 1;
#ifdef DRIFT_PROBE
                    if
                    :: S2_r != S_r -> drifted = 1
                    :: else -> skip
                    fi;
#endif
#ifdef CHECK_RESYNC
                    /* no receive is outstanding but this one: the estimate
                     * should be exact at the start of a direct phase */
                    assert(S2_r == S_r);
#endif
#ifdef RESYNC
                    S2_r = S_r;
#endif
                    skip
                :: else -> skip
                fi;
                assert(nfull(ctl));
                ctl!ADVERT, S2_r, P_r, rlen, w, q_id[h];
                printf("MSC: R posts receive %d (len %d, waitall %d): ADVERT S_A %d P_A %d\n", q_id[h], rlen, w, S2_r, P_r);
                if
                :: w -> S2_r = S2_r + rlen
                :: else -> S2_r = S2_r + 1
                fi;
                q_adv[h] = CUR
            :: else ->
                q_adv[h] = NONE;
                k_b++;
                printf("MSC: R posts receive %d (len %d, waitall %d): no ADVERT (b_r %d k_a %d k_b %d)\n", q_id[h], rlen, w, b_r, k_a, k_b)
            fi
#endif
        }

    /* a direct transfer (Fig. 4 lines 1-6) */
    :: data?DIRECT, id, S, lw ->
        atomic {
            printf("MSC: R gets DIRECT tag %d bytes %d+%d; head receive %d, S_r %d\n", id, S, lw, q_id[qh], S_r);
            assert(S == arrived);
            arrived = arrived + lw;
            /* (a) it lands in the head receive, through that receive's
             * current ADVERT, at the next offset expected */
            assert(qn > 0);
            h = qh;
            assert(q_adv[h] == CUR);
            assert(q_id[h] == id);
            assert(S == S_r);
            assert(b_r == 0);
            assert(q_got[h] + lw <= q_len[h]);
#if defined(IMPL_RULE) && defined(LATE_ADVERT_PROBE)
            assert(!q_late[h]);
#endif
            S_r = S_r + lw;
            q_got[h] = q_got[h] + lw;
            if
            :: !q_w[h] -> S2_r = S2_r + lw - 1
            :: else -> skip
            fi;
            if
            :: !q_w[h] || q_got[h] == q_len[h] ->
                qh = (qh + 1) % RQ; qn--
            :: else -> skip
            fi;
#ifdef IMPL_RULE
            IMPL_KICK;
#endif
            skip
        }

    /* an indirect transfer (Fig. 4 lines 7-12) */
    :: data?INDIRECT, _, S, lw ->
        atomic {
            printf("MSC: R gets INDIRECT bytes %d+%d, P_r %d\n", S, lw, P_r);
            assert(S == arrived);
            arrived = arrived + lw;
            if
            :: IS_DIRECT(P_r) ->
                P_r = P_r + 1;
                /* outstanding ADVERTs become prior-phase ones */
                j = 0;
                do
                :: j < qn ->
                    h = (qh + j) % RQ;
                    if
                    :: q_adv[h] == CUR -> q_adv[h] = PRIOR; k_a++
                    :: else ->
#if !defined(BROKEN_ADVERT_WHILE_RING_NONEMPTY) && !defined(IMPL_LAZY) && !defined(RX_INDIRECT_ONLY) && !defined(SMALL_RULE)
                        /* in a direct phase every receive has an ADVERT (not so when small
                         * receives stay unadvertised) */
                        assert(false);
#endif
                        skip
                    fi;
                    j++
                :: else -> break
                od
            :: else -> skip
            fi;
            /* (b) the ring keeps the offsets in order, without gaps */
            assert(b_r == 0 || S == ring_start + b_r);
#ifdef DRAIN
            /* no ring byte beyond the position the sender stopped at */
            assert(dr != 2 || S + lw <= dpos);
#endif
            if
            :: b_r == 0 -> ring_start = S
            :: else -> skip
            fi;
            b_r = b_r + lw;
            assert(b_r <= RING);
#ifdef IMPL_RULE
            IMPL_KICK;
#endif
            skip
        }

    /* copy out of the ring into the head receive (Fig. 5); the freed space
     * goes back at once (RB2 with a 2-byte ring reports every byte) */
    :: qn > 0 && b_r > 0 ->
        atomic {
            h = qh;
            /* (b) the bytes copied are the next ones of the stream */
            assert(ring_start == S_r);
#ifndef BROKEN_ADVERT_WHILE_RING_NONEMPTY
            /* ring bytes never go to a receive of the current phase */
            assert(q_adv[h] != CUR);
#endif
            lc = MIN(b_r, q_len[h] - q_got[h]);
            assert(lc > 0);
            b_r = b_r - lc;
            ring_start = ring_start + lc;
            S_r = S_r + lc;
            q_got[h] = q_got[h] + lc;
            printf("MSC: R copies bytes %d+%d from the ring into receive %d\n", S_r - lc, lc, q_id[h]);
            if
            :: q_adv[h] != NONE && !q_w[h] -> S2_r = S2_r + lc - 1
#ifdef RESYNC_FIG5
            :: q_adv[h] == NONE -> S2_r = S2_r + lc
#endif
            :: else -> skip
            fi;
            assert(nfull(ctl));
            ctl!ACK, lc, 0, 0, 0, 0;
            if
            :: !q_w[h] || q_got[h] == q_len[h] ->
                if
                :: q_adv[h] == PRIOR -> k_a--
                :: q_adv[h] == NONE -> k_b--
                :: else -> skip
                fi;
                qh = (qh + 1) % RQ; qn--
            :: else -> skip
            fi;
#ifdef IMPL_RULE
            IMPL_KICK;
#endif
            skip
        }

#ifdef DRAIN
    /* 7.2: the request, at any moment the C rule allows */
    :: IS_INDIRECT(P_r) && dr == 0 && RX_ADVERTISES && !eos ->
        atomic {
            assert(nfull(ctl));
            ctl!DRAIN_REQ, arrived, P_r, 0, 0, 0;
            printf("MSC: R sends DRAIN at %d in phase %d\n", arrived, P_r);
            dr = 1
        }
    /* the sender's STOPPED answer (the C code's checks as assertions) */
    :: stp?S, dph ->
        atomic {
            assert(dr == 1 && dph == P_r && S >= arrived);
            dr = 2;
            dpos = S;
            IMPL_KICK;
            skip
        }
#endif

    /* END: the sender's total */
    :: data?END, _, S, _ ->
        assert(S == arrived && S == TOTAL);
        eos = 1

    /* end of stream: the head receive completes with what it holds */
    :: qn > 0 && eos && S_r == arrived ->
        atomic {
            h = qh;
            if
            :: q_adv[h] == PRIOR -> k_a--
            :: q_adv[h] == NONE -> k_b--
            :: else -> skip
            fi;
            qh = (qh + 1) % RQ; qn--
        }

#if defined(IMPL_RULE) && defined(IMPL_LAZY)
    /* the deferred evaluation of the C rule, at any later moment */
    :: adv_pending -> atomic { adv_pending = 0; impl_advertise() }
#endif

    :: posted >= NRECV && qn == 0 && eos && S_r == arrived ->
        break
    od;
    /* (b) nothing lost, nothing duplicated: every byte went to a receive */
    assert(S_r == TOTAL && b_r == 0 && arrived == TOTAL)
}

init {
    atomic {
        run Sender();
        run Receiver()
    }
}
