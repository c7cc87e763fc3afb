#!/bin/bash
# busy CPU-seconds machine-wide while running "$@"
read -r _ u n s i w x y z _ < /proc/stat; b0=$((u+n+s+x+y+z)); t0=$(date +%s.%N)
"$@"; rc=$?
read -r _ u n s i w x y z _ < /proc/stat; b1=$((u+n+s+x+y+z)); t1=$(date +%s.%N)
echo "wall $(echo "$t1-$t0" | bc) s, busy CPU $(( (b1-b0)/100 )) s, rc $rc" >&2
