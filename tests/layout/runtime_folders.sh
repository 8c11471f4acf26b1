#!/usr/bin/env bash
# The runtime layer's two subsystems, a folder each (framework/runtime/src/launching and
# communication), share only what lies in runtime/src itself and the layer's public headers: no
# file of one includes a private header of the other. Their public headers are the layer's own,
# so they are checked too: a launching file includes no communication header of the layer, and
# the other way round.
set -uo pipefail
src=$1/framework/runtime
status=0
headers_of() { (cd "$src/src/$1" && ls ./*.h 2>/dev/null | sed 's|^\./||'); }
check() {  # FOLDER OTHER PUBLIC...
  local folder=$1 other=$2
  shift 2
  local names=() h
  while read -r h; do [[ -n $h ]] && names+=("\"$h\"" "\"$other/$h\""); done < <(headers_of "$other")
  for h in "$@"; do names+=("fsdpx/framework/runtime/$h"); done
  for n in "${names[@]}"; do
    found=$(grep -rnF "#include $n" "$src/src/$folder" 2>/dev/null; grep -rnF "#include \"$n\"" "$src/src/$folder" 2>/dev/null)
    if [[ -n $found ]]; then
      echo "FAIL: $folder/ includes $other's header $n:"
      echo "$found"
      status=1
    fi
  done
}
check launching communication communicator.h collective_context.h process_groups.h every_rank.h c10d_backends.h
check communication launching launcher.h cpu_resources.h topology_resolver.h
[[ $status == 0 ]] && echo "runtime/src/launching and runtime/src/communication include nothing of each other"
exit $status
