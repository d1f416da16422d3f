# The device checks of this stage, for a session lent a GPU machine (docs/dynamic-shapes.md):
# pjrt_host and its GPU plugin installed beside the machine's own torch / jax (it reaches no
# package index: importlib-metadata travels as a wheel), then the GPU smoke test, the spike on a
# GPU (bounded dynamism against masks), the dynamic-shapes benchmark, bench_eager, the per-op layers and
# the GIL held by lowering and compiling (16 cores: no contention for cores, unlike the 2 of CI).
# Here, once: echo /.whl/ >> .git/info/exclude; python3 -m pip download --no-deps --only-binary=:all: \
#   --python-version 3.12 --implementation cp --platform manylinux2014_x86_64 -d .whl importlib-metadata==8.7.0
# Then run `bash benchmarks/gpu_stage_checks.sh` through the device tool with carry [".whl"].
set -x
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation --no-cache-dir -e . -e plugins/gpu 2>&1 | tail -3
export PJRT_DEVICE=cuda PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, jax; print('torch', torch.__version__, 'jax', jax.__version__)"
timeout 60 python3 -m pjrt_host list --probe 2>&1 | tee $OUT/list.txt
timeout 150 python3 benchmarks/gpu_smoke.py 2>&1 | tee $OUT/smoke.txt
timeout 120 python3 benchmarks/spike_dynamic_dims.py --ops softmax sum matmul layer_norm xent_seq block --pairs 100:128 65:128 65:80 2>&1 | tee $OUT/spike.txt
timeout 200 python3 benchmarks/bench_dynamic_shapes.py --only train --steps 10 --dropout 0.0 2>&1 | tee $OUT/dyn.txt
timeout 80 python3 benchmarks/bench_eager.py --sizes 256 --calls 200 --rounds 8 2>&1 | tee $OUT/eager.txt
timeout 60 python3 benchmarks/bench_op_layers.py 2>&1 | tee $OUT/op_layers.txt
timeout 60 python3 benchmarks/bench_compile_gil.py --repeats 5 2>&1 | tee $OUT/compile_gil.txt
echo DONE
