# Shared by the examples/ scripts (sourced, not run). Part of the ResNet kit.
KIT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# score_checkpoint DTYPE BATCH PREFIX EPOCH [runner/train.py flags]: runner --mode val on PREFIX-NNNN.params
# (or the original kit's PREFIX_NNNN.params), one worker.
score_checkpoint() {
    local dtype=$1 batch=$2 name
    name=$(basename "$0")
    shift 2
    if [ $# -lt 2 ] || ! [[ $2 =~ ^[0-9]+$ ]]; then
        echo "$name: error: expected PREFIX EPOCH (e.g. runs/demo/model 16), then optional runner flags" >&2
        exit 2
    fi
    local prefix=$1 epoch params=""
    epoch=$(printf %04d "$((10#$2))")
    shift 2
    for candidate in "$prefix-$epoch.params" "${prefix}_$epoch.params"; do
        if [ -f "$candidate" ]; then params=$candidate; break; fi
    done
    if [ -z "$params" ]; then
        echo "$name: error: no checkpoint $prefix-$epoch.params; give the prefix and epoch of a saved one" >&2
        exit 2
    fi
    "$KIT/runner" -n 1 -b "$batch" --dtype "$dtype" --mode val --load "$params" -e 1 "$@"
}
