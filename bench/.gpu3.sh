set -e
export SLM_DEPS_PREFIX=.deps/root CCACHE_DISABLE=1
t0=$(date +%s)
SLM_CUDA=ON BUILD_DIR=build-cuda bash scripts/setup.sh > $OUT/setup.log 2>&1 || { grep -B2 -A12 "error" $OUT/setup.log | head -80; exit 1; }
cmake --build build-cuda --target decode_bench > $OUT/bench_build.log 2>&1 || { grep -A12 error $OUT/bench_build.log | head -60; exit 1; }
echo "setup $(( $(date +%s)-t0 ))s"
build-cuda/tests/slm_tests --gtest_filter='DecodeAttention*:CudaModel*:GraphDecoder*:Decode.*:MoE*:Mamba3Cuda*:M2rnnCuda*' 2>&1 | grep -E "^\[  (FAILED|PASSED) |FAILED|Failure|error|Expected|Which is|actual" | head -40
echo "tests $(( $(date +%s)-t0 ))s"
B=build-cuda/bench/decode_bench
for r in hybrid-250m specialist-small tiny-hybrid; do
  $B --recipe recipes/$r.json --device cuda --dtype bf16 --steps 48 2>&1 | tail -1
  $B --recipe recipes/$r.json --device cuda --dtype bf16 --steps 48 --graph 2>&1 | tail -1
done
$B --recipe recipes/hybrid-250m.json --device cuda --dtype bf16 --steps 16 --graph --profile 2>&1 | grep -v "^ERROR" | head -34
echo "all $(( $(date +%s)-t0 ))s"
