#!/usr/bin/env bash
# Fetch, on this (networked) machine, the wheels a GPU machine needs to run siiRL: the GPU
# image has torch, transformers and the scientific stack but no package registry, and lacks
# what tools/gpu/wheels.txt lists. tools/gpu/check_all.sh installs them there.
#
#   bash tools/gpu/wheels.sh                     # for the GPU image: Python 3.12, x86-64
#   bash tools/gpu/wheels.sh --python 3.11 --dest /tmp/w   # e.g. for check_all.sh --dry-run
#
# Default folder: .gpu-wheels (git-ignored; name it in the device call's carry). The set
# must stay under 60 MiB (a device call carries 64 MiB with the working tree).
set -euo pipefail
cd "$(dirname "$0")/../.."
python_version=3.12
dest=.gpu-wheels
while [[ $# -gt 0 ]]; do
    case "$1" in
        --python) python_version="$2"; shift 2 ;;
        --dest) dest="$2"; shift 2 ;;
        *) echo "usage: bash tools/gpu/wheels.sh [--python X.Y] [--dest DIR]" >&2; exit 2 ;;
    esac
done
limit_mib=60
pip=(python3 -m pip)
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 \
         manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
    platforms+=(--platform "$p")
done
mkdir -p "$dest"
rm -f "$dest"/*.whl  # one version of each: two stop the install there
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
grep -v '^\s*#' tools/gpu/wheels.txt | grep -v '^\s*$' | while read -r spec; do
    if [[ "$spec" == antlr4-python3-runtime==* ]]; then
        # an sdist only: build its (pure-Python) wheel here
        "${pip[@]}" wheel -q --no-deps -w "$dest" "$spec" 2>&1 | grep -v "^WARNING: Location" || true
    else
        "${pip[@]}" download -q --no-deps --only-binary=:all: --python-version "$python_version" \
            --implementation cp "${platforms[@]}" -d "$dest" "$spec" 2>&1 \
            | grep -v "^WARNING: Location" || true
    fi
done
expected=$(grep -v '^\s*#' tools/gpu/wheels.txt | grep -vc '^\s*$')
got=$(find "$dest" -maxdepth 1 -name '*.whl' | wc -l)
if [[ "$got" != "$expected" ]]; then
    echo "wheels.sh: $got of the $expected wheels in tools/gpu/wheels.txt were fetched into $dest" >&2
    exit 1
fi
echo "$python_version" > "$dest/PYTHON_VERSION"
bytes=$(du -cb "$dest"/*.whl | tail -1 | cut -f1)
mib=$(( (bytes + 1048575) / 1048576 ))
echo "wheels.sh: $got wheels for Python $python_version in $dest, $mib MiB"
if (( mib >= limit_mib )); then
    echo "wheels.sh: over the ${limit_mib} MiB limit (a device call carries 64 MiB in all)" >&2
    exit 1
fi
