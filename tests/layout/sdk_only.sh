#!/usr/bin/env bash
# Plugins and the SDK need only the SDK: no file under plugins/ or sdk/ includes a header of
# libfsdpx's layers (fsdpx/framework/...). A third party has sdk/include alone.
set -uo pipefail
src=$1
cd "$src"
found=$(grep -rnE '#[[:space:]]*include[[:space:]]*[<"]fsdpx/framework/' plugins sdk || true)
if [[ -n $found ]]; then
  echo "FAIL: these files include libfsdpx's framework headers; plugins and the SDK may include only sdk/include:"
  echo "$found"
  exit 1
fi
echo "plugins/ and sdk/ include no fsdpx/framework/ header"
