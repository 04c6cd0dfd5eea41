#!/usr/bin/env bash
# Prints the folder-level include graph of include/kat: for each pair of folders, how many
# #include lines run from one to the other, and every edge that runs upward, from a lower floor
# of the library to a higher one (docs/design.md). Exits 1 when there is an upward edge.
#   scripts/include_graph.sh            the graph and the upward edges
# Floors, from the ground up: core; precond, optim, plan, io, data; nn; train; distributed,
# sparse. An include within a floor or downward is allowed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root/include"
grep -rnE '^#include [<"]kat/[a-z_]+/' kat --include='*.hpp' |
  sed -E 's#^kat/([a-z_]+)/[^:]*:[0-9]+:\#include [<"]kat/([a-z_]+)/([^">]*)[">].*#\1 \2 &#' |
  awk '
    BEGIN {
      floor["core"] = 0
      floor["precond"] = 1; floor["optim"] = 1; floor["plan"] = 1; floor["io"] = 1; floor["data"] = 1
      floor["nn"] = 2; floor["train"] = 3; floor["distributed"] = 4; floor["sparse"] = 4
      up = 0
    }
    NF >= 3 && ($1 in floor) && ($2 in floor) {
      if ($1 != $2) edges[$1 " -> " $2]++
      if (floor[$2] > floor[$1]) {
        split($3, where, ":")
        upward[++up] = where[1] " includes kat/" $2 " (" $1 ", floor " floor[$1] " -> floor " floor[$2] ")"
      }
    }
    END {
      print "folder-level include edges (#include lines):"
      for (e in edges) printf "  %-26s %4d\n", e, edges[e] | "sort"
      close("sort")
      printf "upward edges: %d\n", up
      for (i = 1; i <= up; i++) print "  " upward[i]
      exit up > 0
    }'
