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
 *   CHECK_RESYNC          assert that S'_r == S_r whenever a new direct phase
 *                         starts (the first ADVERT of a sequence is exact)
 *   BROKEN_ADVERT_WHILE_RING_NONEMPTY  receiver ignores b_r > 0 (Fig. 3 line 1)
 *   BROKEN_IGNORE_PRIOR_ADVERTS        receiver ignores k_a > 0 (Fig. 6)
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

#define CTLCAP  6   /* never full: asserted before every send */
#define DATACAP 6
#define QACAP   4   /* ADVERTs the sender holds */
#define RQ      4   /* unsatisfied receives the receiver holds */

/* receive advert state */
#define NONE  0     /* never advertised: counted in k_b */
#define CUR   1     /* advertised in the current direct phase */
#define PRIOR 2     /* advertised in an earlier phase: counted in k_a */

mtype = { ADVERT, ACK, DIRECT, INDIRECT, END };

/* kind, S_A (ACK: bytes freed), P_A, length, MSG_WAITALL, advert id */
chan ctl = [CTLCAP] of { mtype, byte, byte, byte, bit, byte };
/* kind, advert id (DIRECT), offset of the first byte (END: total), length */
chan data = [DATACAP] of { mtype, byte, byte, byte };

/* observable for claims and for the README statistics */
byte n_direct = 0, n_indirect = 0, n_stale = 0;

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
    mtype k;

    do
    :: ctl?k, x1, x2, x3, x4, x5 ->
        if
        :: k == ADVERT -> assert(nfull(qA)); qA!x1, x2, x3, x4, x5
        :: k == ACK -> b_s = b_s + x1; assert(b_s <= RING)
        fi
    :: i < NSEND && (nempty(qA) || b_s > 0) ->
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
                    :: aP > P_s -> P_s = aP + 1
                    :: else -> skip
                    fi;
#endif
                    assert(fill == 0);
                    qA?_, _, _, _, _;
                    n_stale++
                :: else ->
                    if
                    :: IS_INDIRECT(P_s) ->
                        /* resynchronisation: the proof says this ADVERT is
                         * the receiver's head, so it must be exact */
                        assert(aS == S_s && fill == 0);
                        P_s = aP
                    :: else -> skip
                    fi;
                    lw = MIN(left, alen - fill);
                    assert(lw > 0);
                    assert(nfull(data));
                    data!DIRECT, aid, S_s, lw;
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
            :: !used && b_s > 0 ->
                if
                :: IS_DIRECT(P_s) -> P_s = P_s + 1
                :: else -> skip
                fi;
                lw = MIN(left, MIN(b_s, RING - tail));
                assert(nfull(data));
                data!INDIRECT, 0, S_s, lw;
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
    :: ctl?_, _, _, _, _, _
    od
}

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
            /* Fig. 3 */
            if
            :: (b_r == 0
#ifdef BROKEN_ADVERT_WHILE_RING_NONEMPTY
                 || 1
#endif
               ) && (k_a == 0
#ifdef BROKEN_IGNORE_PRIOR_ADVERTS
                 || 1
#endif
               ) && k_b == 0 ->
                if
                :: IS_INDIRECT(P_r) ->
                    P_r = P_r + 1;
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
                if
                :: w -> S2_r = S2_r + rlen
                :: else -> S2_r = S2_r + 1
                fi;
                q_adv[h] = CUR
            :: else ->
                q_adv[h] = NONE;
                k_b++
            fi
        }

    /* a direct transfer (Fig. 4 lines 1-6) */
    :: data?DIRECT, id, S, lw ->
        atomic {
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
            fi
        }

    /* an indirect transfer (Fig. 4 lines 7-12) */
    :: data?INDIRECT, _, S, lw ->
        atomic {
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
                    :: else -> skip
                    fi;
                    j++
                :: else -> break
                od
            :: else -> skip
            fi;
            /* (b) the ring keeps the offsets in order, without gaps */
            assert(b_r == 0 || S == ring_start + b_r);
            if
            :: b_r == 0 -> ring_start = S
            :: else -> skip
            fi;
            b_r = b_r + lw;
            assert(b_r <= RING)
        }

    /* copy out of the ring into the head receive (Fig. 5); the freed space
     * goes back at once (RB2 with a 2-byte ring reports every byte) */
    :: qn > 0 && b_r > 0 ->
        atomic {
            h = qh;
            /* (b) the bytes copied are the next ones of the stream */
            assert(ring_start == S_r);
            lc = MIN(b_r, q_len[h] - q_got[h]);
            assert(lc > 0);
            b_r = b_r - lc;
            ring_start = ring_start + lc;
            S_r = S_r + lc;
            q_got[h] = q_got[h] + lc;
            if
            :: q_adv[h] != NONE && !q_w[h] -> S2_r = S2_r + lc - 1
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
            fi
        }

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
