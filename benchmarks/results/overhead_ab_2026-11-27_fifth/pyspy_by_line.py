import sys
from collections import Counter
self_c=Counter(); incl=Counter(); total=0
key=sys.argv[2]
for line in open(sys.argv[1]):
    stack, n = line.rstrip().rsplit(' ',1); n=int(n)
    if key not in stack: continue
    total+=n
    frames=stack.split(';')
    self_c[frames[-1]]+=n
    seen=set()
    for f in frames:
        fn=f.split(' (')[0]+' '+f.split(' (')[1].split(':')[0] if ' (' in f else f
        if fn not in seen: incl[fn]+=n; seen.add(fn)
print("total", total)
for f,n in self_c.most_common(int(sys.argv[3])): print(f"{100*n/total:5.1f}% {f}")
print("--- inclusive")
for f,n in incl.most_common(int(sys.argv[3])): print(f"{100*n/total:5.1f}% {f}")
