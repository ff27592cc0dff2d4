#!/usr/bin/env bash
# A lent GPU session's measurements (issues 45 and 46), prepared here and run there in two
# calls of the device tool (15 minutes of device time in all, 10 a call):
#
#   here:   bash benchmarks/gpu_session.sh prepare
#           (wheels the GPU image lacks, for its Python 3.12; CIFAR-10's JPEG tarball and
#           the NAS-Bench-201 table; all into .gpu/, which git ignores)
#   there:  run(command="bash benchmarks/gpu_session.sh measure", carry=[".gpu/wheels",
#               ".gpu/fmnist"], timeout_s=590)
#           run(command="bash benchmarks/gpu_session.sh nb201 60", carry=[".gpu/wheels",
#               ".gpu/shared"], timeout_s=<what is left, less 20 s>)
#           (the carry limit, 64 MiB with the tree, holds one call's data, not both; the
#           machine's start took about a minute on 2026-11-29, measure about 530 s then and
#           about 60 s more now (ws_example's second optimize(1000), by four workers), so the
#           nb201 call gets about 3 minutes: its proxies write each seed as it ends, and what
#           a call's timeout cuts is lost only from the section it cut)
#
# measure: tests/test_gpu.py, then benchmarks/gpu.py's sections of issue 45, the targets first
#   (workers, fused, placement, subnet, ws_example: the ones the H200 of 2026-11-29 left
#   unmeasured or unexplained first), each section's JSON written to $OUT/gpu.json as it
#   ends. Not int8: the GPU image's torch 2.11 has no int8 CPU kernels to lower the real
#   program with (int8_estimate.py exits saying so), so the estimate has nothing there to
#   be timed against.
# nb201 SECONDS: the full-size NAS-Bench-201 supernet benchmark (C = 16, N = 5, 32 x 32), its
#   study folder resumed from .gpu/nb201-work.tar.gz where an earlier session left one; stopped
#   with SIGINT after SECONDS (the epoch's checkpoint finishes), its folder packed into
#   $OUT/nb201-work.tar.gz: copy that to .gpu/ to go on in the next session. Before it, the
#   evaluator seam's cost on the GPU (evaluator_overhead.py --device cuda, at most 75 s), the
#   zero-cost proxies of the whole space resumed on the GPU for at most 3 minutes
#   (nb201_proxies.py --whole-space, from the committed benchmarks/nb201/proxies-whole-space.json,
#   which travels with the tree): $OUT/proxies-whole-space.json holds every cell scored so
#   far, written every 50 cells; copy it over the committed file to keep the GPU's part.
# sharding: FSDP / HSDP against DDP (benchmarks/sharding.py, ResNet-18 on CIFAR-10 images,
#   bf16): the peak CUDA memory and the bytes each rank holds, on as many ranks as the
#   machine has GPUs (one process only on a one-GPU machine: nccl takes a GPU a rank).
#   run(command="bash benchmarks/gpu_session.sh sharding", carry=[".gpu"], timeout_s=300)
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
gpu=.gpu
mode=${1:?usage: gpu_session.sh prepare | measure | nb201 SECONDS | sharding}

if [ "$mode" = prepare ]; then
    mkdir -p "$gpu/wheels" "$gpu/shared/datasets" "$gpu/shared/benchdata"
    py=${PYTHON:-.venv/bin/python}
    # What the GPU image (Python 3.12, torch 2.11) lacks, at the versions this checkout uses.
    for name in optuna sqlalchemy alembic colorlog mako torchao torch-pruning plotly narwhals \
        pillow typing-extensions greenlet; do
        version=$("$py" -m pip show "$name" 2>/dev/null | sed -n 's/^Version: //p')
        "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
            --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
            -d "$gpu/wheels" "$name${version:+==$version}" || echo "no wheel: $name"
    done
    cp ../shared/datasets/cifar10-jpeg.tar.gz "$gpu/shared/datasets/"
    cp ../shared/benchdata/nb201_cifar10_valid.csv "$gpu/shared/benchdata/"
    # Fashion-MNIST's IDX files (the GPU image has no dataset-fashion-mnist package).
    mkdir -p "$gpu/fmnist"
    cp /usr/share/datasets/fashion-mnist/*.gz "$gpu/fmnist/"
    du -sh "$gpu"
    exit 0
fi

out=${OUT:?the device tool sets OUT}
export PYTHONUNBUFFERED=1 AUTOSEARCH_SHARED="$here/$gpu/shared"
{
    nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv
    python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name())'
} >"$out/device.txt" 2>&1
python3 -m pip install -q --no-index --no-deps "$gpu"/wheels/*.whl >>"$out/device.txt" 2>&1
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >>"$out/device.txt" 2>&1

case "$mode" in
measure)
    timeout -k 10 90 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py \
        >"$out/test_gpu.txt" 2>&1
    timeout -k 10 -s INT 470 python3 benchmarks/gpu.py --workers-trials 8 --data "fashion-mnist:$gpu/fmnist" \
        --only workers fused placement subnet ws_example --out "$out/gpu.json" \
        >"$out/gpu.log" 2>&1
    tail -3 "$out/test_gpu.txt"
    cat "$out/gpu.json"
    ;;
nb201)
    seconds=${2:-420}
    # A user's evaluator on the GPU: the seam's cost against the trainer itself (fresh
    # processes, alternating; the CPU's figure is on the results page).
    timeout -k 10 75 python3 benchmarks/evaluator_overhead.py --device cuda --trials 6 \
        --repeats 3 --epochs 2 >"$out/evaluator-overhead.json" 2>"$out/evaluator-overhead.log"
    echo "evaluator: exit $?" >>"$out/evaluator-overhead.log"
    # The whole space's zero-cost proxies at the real size, resumed where the CPU sessions
    # left them (the same seed's batch and initializations; the GPU's part named in the file).
    cp benchmarks/nb201/proxies-whole-space.json "$out/proxies-whole-space.json"
    timeout -k 20 -s INT 200 python3 benchmarks/nb201_proxies.py --device cuda --seeds 0 \
        --whole-space "$out/proxies-whole-space.json" --minutes 3 \
        >/dev/null 2>"$out/nb201-proxies.log"
    echo "proxies: exit $?" >>"$out/nb201-proxies.log"
    tail -2 "$out/nb201-proxies.log"
    work=$(mktemp -d)
    if [ -f "$gpu/nb201-work.tar.gz" ]; then
        tar -C "$work" -xzf "$gpu/nb201-work.tar.gz"
        echo "resumed from $gpu/nb201-work.tar.gz" >>"$out/device.txt"
    fi
    timeout -k 30 -s INT "$seconds" python3 benchmarks/nb201_supernet.py --scale full \
        --work "$work" --out "$out/nb201-full.json" >"$out/nb201.log" 2>&1
    echo "exit $?" >>"$out/nb201.log"
    tar -C "$work" --exclude='./datasets' -czf "$out/nb201-work.tar.gz" .
    tail -5 "$out/nb201.log"
    ;;
sharding)
    gpus=$(nvidia-smi -L | wc -l)
    only=("one process")
    [ "$gpus" -ge 2 ] && only+=("ddp x2" "fsdp x2")
    [ "$gpus" -ge 4 ] && only+=("ddp x4" "fsdp x4" "hsdp 2x2")
    timeout -k 10 250 python3 benchmarks/sharding.py --device cuda --precision bf16 \
        --data cifar10-sample --images 8192 \
        --batch-size 256 --only "${only[@]}" >"$out/sharding.json" 2>"$out/sharding.log"
    tail -3 "$out/sharding.log"
    cat "$out/sharding.json"
    ;;
*)
    echo "unknown mode $mode: prepare | measure | nb201 SECONDS | sharding" >&2
    exit 2
    ;;
esac
