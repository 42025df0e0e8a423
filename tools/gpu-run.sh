#!/bin/sh
# tools/gpu-run.sh - everything the GPU backends need a GPU for, in one go (one device
# call): environment facts, the GPU tests, native-code check, compute-sanitizer on the
# cuda backend's quick cases, `fp4doctor check` (when built) and `fp4doctor bench`.
#
#   tools/gpu-run.sh BUILD_DIR [OUT_DIR] [what...]     what: env test sanitize check bench (default: all)
#
# BUILD_DIR holds fp4doctor and test_gpu_backends. Shared libraries that the GPU machine
# lacks (jansson, cmocka) may sit in .devdeps/lib; cuDNN is found in the usual places or in
# the nvidia-cudnn pip package. Results go to OUT_DIR (default $OUT or ./gpu-out).
set -u
B=${1:?usage: tools/gpu-run.sh BUILD_DIR [OUT_DIR] [what...]}
O=${2:-${OUT:-./gpu-out}}
shift; [ $# -gt 0 ] && shift
WHAT=${*:-env test sanitize check bench}
mkdir -p "$O"
export NO_COLOR=1
LD_LIBRARY_PATH="$(pwd)/.devdeps/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for d in /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu \
         $(python3 -c 'import nvidia.cudnn, os; print(os.path.join(os.path.dirname(nvidia.cudnn.__file__), "lib"))' 2>/dev/null); do
    [ -e "$d/libcudnn.so.9" ] && LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d" && break
done
export LD_LIBRARY_PATH
has() { case " $WHAT " in *" $1 "*) return 0;; esac; return 1; }

if has env; then
    { nvidia-smi; nvcc --version; echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"; ls /usr/local/cuda/lib64 | grep -i cudnn;
      compute-sanitizer --version; "$B/fp4doctor" env; "$B/fp4doctor" backends;
      cuobjdump --list-elf "$B/fp4doctor"; } > "$O/env.txt" 2>&1
    tail -40 "$O/env.txt"
fi
if has test; then
    "$B/test_gpu_backends" > "$O/test.txt" 2>&1; echo "test_gpu_backends rc=$?" | tee -a "$O/test.txt"
    # the build's PTX instead of its SASS, as on a GPU without native code here (ctest gpu_backends_ptx_jit)
    CUDA_FORCE_PTX_JIT=1 FP4D_GPU_TEST_FILTER=test_wgmma_follows_loaded_image "$B/test_gpu_backends" >> "$O/test.txt" 2>&1
    echo "test_gpu_backends under CUDA_FORCE_PTX_JIT=1 rc=$?" | tee -a "$O/test.txt"
    grep -E "cases|UNSUPPORTED|FAILED|PASSED|SKIPPED|out\[" "$O/test.txt" | head -40
fi
if has sanitize; then
    # the cuda backend's own tests, and the doctor's quick suite on cuda (its child
    # processes are followed: compute-sanitizer's default --target-processes all)
    for tool in memcheck initcheck racecheck synccheck; do
        FP4D_GPU_TEST_QUICK=1 FP4D_GPU_TEST_FILTER='test_cuda*' timeout 150 compute-sanitizer --tool $tool \
            --error-exitcode 9 "$B/test_gpu_backends" > "$O/sanitize-$tool.txt" 2>&1
        echo "compute-sanitizer $tool (tests) rc=$?: $(grep -E 'ERROR SUMMARY' "$O/sanitize-$tool.txt" | tail -1)"
        timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 "$B/fp4doctor" check --backend cuda \
            --suite quick --no-cache > "$O/sanitize-check-$tool.txt" 2>&1
        echo "compute-sanitizer $tool (check quick) rc=$?: $(grep -E 'ERROR SUMMARY' "$O/sanitize-check-$tool.txt" | tail -3 | tr '\n' ' ')"
    done
fi
if has check; then
    timeout 300 "$B/fp4doctor" check --backend cuda,cublas-bf16,cublaslt,cudnn --suite full > "$O/check.txt" 2>&1
    echo "check rc=$?"; tail -30 "$O/check.txt"
fi
if has bench; then
    timeout 420 "$B/fp4doctor" bench --json "$O/bench.json" > "$O/bench.txt" 2>&1
    echo "bench rc=$?"; cat "$O/bench.txt"
fi
