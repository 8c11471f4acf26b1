#!/usr/bin/env bash
# Installs what fsdpx needs to build and test, and is quick when everything is there:
#   - Debian packages (Boost 1.81, GoogleTest, nlohmann-json, xxHash, ccache, CMake, Ninja, and
#     Slurm with munge for the Slurm tests); with --sanitize also clang 14, for the sanitizer and
#     fuzzing build (make test-sanitize, make fuzz), which make test does not need;
#   - torch==2.11.0 from PyPI into a virtual environment cached outside the checkout, with
#     matplotlib (fsdpx-plot), safetensors (the interop test), scikit-learn (its breast-cancer CSV)
#     and lizard (the function-length check). Where python3 can make a virtual environment
#     already, pip runs while apt-get does.
# --print-breast-cancer-csv prints that CSV's path (after making sure it is installed).
# Prints nothing but progress on stderr; the venv's python path on stdout when asked with --print-python.
set -euo pipefail

TORCH_VERSION=2.11.0
CACHE_ROOT=${FSDPX_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/fsdpx}
VENV=${FSDPX_VENV:-$CACHE_ROOT/venv-torch-$TORCH_VERSION}
DEB_PACKAGES=(
  build-essential cmake ninja-build ccache
  libboost1.81-dev libboost-program-options1.81-dev
  libgtest-dev libgmock-dev nlohmann-json3-dev
  libxxhash-dev                         # XXH3, the checkpoints' row digests (header-only use)
  python3-venv
  fortunes                              # the demo's English text corpus (/usr/share/games/fortunes)
  slurmctld slurmd slurm-client munge   # the Slurm tests' one-node cluster
)
SANITIZE_PACKAGES=(clang-14 libclang-rt-14-dev llvm-14)  # ASan, UBSan, libFuzzer, the symbolizer

say() { printf 'setup: %s\n' "$*" >&2; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

case ${1:-} in
  --print-python) echo "$VENV/bin/python"; exit 0 ;;
  --sanitize) DEB_PACKAGES+=("${SANITIZE_PACKAGES[@]}") ;;
  --print-breast-cancer-csv | "") ;;
  *) die "unknown option '$1': the options are --sanitize, --print-python and --print-breast-cancer-csv" ;;
esac

# --- Debian packages -----------------------------------------------------------------
install_debian_packages() {
  local missing=() p SUDO=
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$' || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  command -v apt-get >/dev/null || die "missing Debian packages (${missing[*]}) and no apt-get to install them"
  [[ $(id -u) == 0 ]] || SUDO=sudo
  say "installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -q >&2 || die "apt-get update failed: the Debian package registry cannot be reached"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" >&2 \
    || die "apt-get install ${missing[*]} failed (see above)"
}

# --- torch in a cached virtual environment --------------------------------------------
have_torch() {
  [[ -x $VENV/bin/python ]] &&
    "$VENV/bin/python" - "$TORCH_VERSION" <<'PY' 2>/dev/null
import sys, importlib.metadata as md
sys.exit(0 if md.version("torch").split("+")[0] == sys.argv[1] else 1)
PY
}
# A venv with pip in it; one that python3 could not finish (Debian's python3 without python3-venv
# leaves one without pip) is removed. Quiet: the caller says what failing means.
make_venv() {
  "$VENV/bin/python" -m pip --version >/dev/null 2>&1 && return 0
  rm -rf "$VENV"
  mkdir -p "$CACHE_ROOT"
  say "creating virtual environment $VENV"
  python3 -m venv "$VENV" >/dev/null 2>&1 && "$VENV/bin/python" -m pip --version >/dev/null 2>&1 && return 0
  rm -rf "$VENV"
  return 1
}
install_torch() {
  have_torch && return 0
  make_venv || die "python3 -m venv $VENV failed (python3 -m venv $VENV shows why)"
  say "installing torch==$TORCH_VERSION (with its CUDA libraries) into $VENV; this is large and happens once"
  if ! "$VENV/bin/python" -m pip install -q --disable-pip-version-check "torch==$TORCH_VERSION" >&2; then
    if ! "$VENV/bin/python" -m pip download -q --no-deps -d "$(mktemp -d)" six >/dev/null 2>&1; then
      die "PyPI cannot be reached, so torch==$TORCH_VERSION cannot be installed into $VENV"
    fi
    die "pip install torch==$TORCH_VERSION into $VENV failed (see above)"
  fi
  have_torch || die "torch==$TORCH_VERSION is not importable from $VENV after installing it"
}
# pip beside apt-get when the venv can be made before Debian's python3-venv is there (a fresh
# machine's two downloads at once); else apt-get first.
if ! have_torch && make_venv; then
  install_torch &
  torch_pid=$!
  # apt-get failed: pip (the background shell's child) stops too.
  trap '[[ -n $torch_pid ]] && { kids=$(pgrep -P "$torch_pid"); kill "$torch_pid" $kids; } 2>/dev/null' EXIT
  install_debian_packages "${DEB_PACKAGES[@]}"
  wait "$torch_pid" || exit 1
  torch_pid=
else
  install_debian_packages "${DEB_PACKAGES[@]}"
  install_torch
fi
# --- Python tools beside torch: plots, the safetensors interop test, the breast-cancer CSV, ----
# --- transformers and tokenizers for the Hugging Face interop (scripts/tokenize, tests/hf), -----
# --- vit-pytorch for the vit model's reference (tests/hf/vit_interop_test.py); it imports --------
# --- torchvision, whose release for torch 2.11 is 0.26 (a later one would replace torch); ---------
# --- torchao for float8's reference (benchmarks/vs_fsdp2 --configs ...:float8:...) -----------------
PY_TOOLS=(matplotlib safetensors scikit-learn lizard transformers==5.23.0 tokenizers==0.23.3 vit-pytorch==1.26.14
          torchvision==0.26.0 torchao==0.18.0)
if ! "$VENV/bin/python" - <<'PY' 2>/dev/null; then
import matplotlib, safetensors, sklearn, lizard, vit_pytorch, importlib.metadata as md
assert md.version("transformers") == "5.23.0" and md.version("tokenizers") == "0.23.3"
assert md.version("vit-pytorch") == "1.26.14" and md.version("torchvision") == "0.26.0"
assert md.version("torchao") == "0.18.0"
PY
  say "installing ${PY_TOOLS[*]} into $VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "torch==$TORCH_VERSION" "${PY_TOOLS[@]}" >&2 \
    || die "pip install ${PY_TOOLS[*]} into $VENV failed (see above)"
fi
if [[ ${1:-} == --print-breast-cancer-csv ]]; then
  "$VENV/bin/python" -c "import os, sklearn; print(os.path.join(os.path.dirname(sklearn.__file__), 'datasets', 'data', 'breast_cancer.csv'))"
  exit 0
fi
say "ready: torch $TORCH_VERSION in $VENV"
