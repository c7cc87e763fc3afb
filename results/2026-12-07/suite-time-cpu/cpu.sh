#!/bin/bash
# busy CPU-seconds machine-wide while running "$@", and the machine's speed before and after it: one core's
# time for a fixed pure-Python loop (the same work every run, so a slower machine shows as a longer time;
# compare suite times only between runs whose speed lines agree)
speed() { python3 -c 'import time; t = time.process_time(); sum(i * i for i in range(10_000_000)); print(f"{time.process_time() - t:.2f}")'; }
s0=$(speed)
read -r _ u n s i w x y z _ < /proc/stat; b0=$((u+n+s+x+y+z)); t0=$(date +%s.%N)
"$@"; rc=$?
read -r _ u n s i w x y z _ < /proc/stat; b1=$((u+n+s+x+y+z)); t1=$(date +%s.%N)
echo "wall $(echo "$t1-$t0" | bc) s, busy CPU $(( (b1-b0)/100 )) s, rc $rc, speed loop $s0 s before, $(speed) s after" >&2
