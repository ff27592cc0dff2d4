#!/usr/bin/env bash
# The "full" ground truth of both sub-spaces and their ranking supernets, on one GPU, in
# one go: four stand-alone training processes (each sub-space, each seed) and two
# supernet processes (each sub-space: the sandwich rule, then progressive shrinking)
# share the GPU (under CUDA MPS where it runs). Each table is saved after every training,
# so a run stopped at SECONDS keeps what it trained; everything lands in OUT_DIR/all.tar.gz.
# Then, on any machine:
#
#   python benchmarks/ground_truth.py --space resnet --merge OUT/resnet-0.json OUT/resnet-1.json
#   cp OUT/supernets/* benchmarks/ground_truth/supernets/
#
# usage: benchmarks/ground_truth_gpu.sh OUT_DIR [SECONDS] [SUPERNET_EPOCHS]
# TRUTH (SPACE:SEED ...) and SUPERNETS (SPACE:SCHEDULE,... ...) choose what runs; by
# default every seed of the protocol and both schedules of both sub-spaces.
set -u
out=${1:?usage: ground_truth_gpu.sh OUT_DIR [SECONDS] [SUPERNET_EPOCHS]}
seconds=${2:-480}
epochs=${3:-40}
py=${PYTHON:-python3}
work=$(mktemp -d)
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$work/gpu.txt" 2>&1
nvidia-cuda-mps-control -d >>"$work/gpu.txt" 2>&1 && echo "MPS on" >>"$work/gpu.txt"
for job in ${TRUTH:-resnet:0 resnet:1 resnet:2 resnet:3 mobilenet:0 mobilenet:1}; do
    space=${job%:*} seed=${job#*:}
    timeout -k 15 -s INT "$seconds" "$py" benchmarks/ground_truth.py --space "$space" \
        --protocol full --seeds "$seed" --threads 2 --out "$work/$space-$seed.json" \
        >"$work/$space-$seed.log" 2>&1 &
done
for job in ${SUPERNETS:-resnet:sandwich,progressive mobilenet:sandwich,progressive}; do
    space=${job%:*} schedules=${job#*:} name=${job//[:,]/-}
    timeout -k 15 -s INT "$seconds" "$py" benchmarks/weight_sharing.py --only supernets \
        --protocol full --space "$space" --schedules "$schedules" \
        --supernet-epochs "$epochs" --threads 2 --workdir "$work/studies-$name" \
        --save-supernets "$work/supernets" >"$work/supernets-$name.log" 2>&1 &
done
wait
rm -rf "$work"/studies-*
mkdir -p "$out"
tar -C "$work" -czf "$out/all.tar.gz" .
for f in "$work"/*.log; do echo "== $f"; tail -n 4 "$f"; done
