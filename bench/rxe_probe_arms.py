#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""rxe_probe_arms.py OUT.LOG...: per 64 KiB message (bytes moved between the two snapshots / 65536),
the engine and provider counters and thread switches of bench/rxe-probe-arms.sh, per variant and run."""
import sys,re,collections,statistics
keys=['engine_lease_fires','engine_lease_grows','engine_lease_idles','engine_evq_fd_writes','engine_drives_app','engine_drives_thread','engine_lease_handoffs','engine_post_holds','engine_arms','prov_verbs_cq_event_reads','thr_progress_vcs','thr_blast_vcs','thr_blast_ivcs']
snaps=collections.defaultdict(dict); rows=collections.defaultdict(list)
for f in sys.argv[1:]:
  for l in open(f):
    m=re.match(r'M tag=(\S+) (\S+?)(\{[^}]*\})? (\S+)',l)
    if m:
        k=m.group(2).replace('exs_','').replace('_total','').replace('exs_progress','progress')
        k=re.sub(r'thr_blast[XB]_','thr_blast_',k).replace('thr_exs_progress','thr_progress')
        try: snaps[m.group(1)][k]=float(m.group(4))
        except: pass
        continue
    m=re.match(r'BW cyc=(\d+) tag=(\S+) gbps=(\S*) msgs=(\S*)',l)
    if m:
        tag=m.group(2)
        r={'gbps':float(m.group(3) or 0)}
        for side,bk in (('c','process_bytes_sent'),('s','process_bytes_received')):
            a,b=snaps.get(side+'0',{}),snaps.get(side+'1',{})
            if bk in a and bk in b and b[bk]>a[bk]:
                msgs=(b[bk]-a[bk])/65536
                for k in keys:
                    r[side+':'+k]=(b.get(k,0)-a.get(k,0))/msgs
        rows[tag].append(r); snaps=collections.defaultdict(dict)
for tag,rs in rows.items():
    print(f"{tag:6} n={len(rs)} gbps " + ' '.join(f"{r['gbps']:.3f}" for r in rs))
    for side in 'cs':
        out=[]
        for k in keys:
            v=[r[side+':'+k] for r in rs if side+':'+k in r]
            if v: out.append(f"{k.replace('engine_','').replace('prov_verbs_','')}={'/'.join(f'{x:.2f}' for x in v)}")
        print('   ',side,' '.join(out))
