#!/usr/bin/env bash
# The GPU check, one script for a single-GPU Linux box with CUDA 13, cmake and a compiler (and
# PyTorch for the reference figures), in a few minutes:
#   1. dependencies: the box's own when CMake finds them, else the Debian packages that
#      scripts/gpu_debs downloaded beforehand (.gpu-debs/), unpacked with dpkg -x into a prefix;
#   2. build (BERTH_GPU_CHECK: the backend, its tests and bench_gpu_ops; sm_90 unless
#      BERTH_CUDA_ARCHS says otherwise), or reuse BUILD_DIR if it already holds a GPU-check build;
#   3. GPU tests: ctest -L gpu (gpu.BackendOps.*, gpu.ModelOnBackend.*, and gpu.single.Nccl.*: the
#      NCCL communicator on one rank, NCCL from the toolkit or PyTorch's wheel), those of the tiled
#      attention kernels (never run on a GPU: a hang there must not starve the others) in a second
#      pass; the measured CUDA-vs-CPU errors of every op (BERTH_TOL_REPORT=1) from their logs;
#   4. benchmark, each part in its own process (a CUDA error poisons the process's context): berth's
#      bf16 GPT-2 step, PyTorch's figures (bench/gpu/torch_reference.py), berth's bf16 attention
#      and GEMM, then the fp32 half; then bench/gpu/compare.py's berth/PyTorch ratios (printed, so
#      a caller that sees only the output's end sees them). When nothing could be built, PyTorch's
#      figures are still measured;
#   5. with BERTH_GPU_CHECK_HOST_TESTS=1 only, the host runs of the same test binaries (ctest -L
#      cpu), last: CI runs them, and a lent GPU's minutes are better kept for a second run.
# Everything lands in OUTDIR (up to eight files: do not tee more into it, gpu_check.log has this
# output); the exit status is the GPU tests' (3 when a GPU
# is visible and a GPU test skipped anyway: it checked nothing; also written
# to OUTDIR/gpu_tests_rc as soon as they end, should the box's own limit stop the script later).
# Every phase is capped by one deadline, BERTH_GPU_CHECK_BUDGET_S (default 400 s) from the start;
# give the command a limit of the budget + 60 s (BERTH_GPU_CHECK_BUDGET_S=400 with a 460 s limit
# fits the device's 8 minutes). A test that hangs (the tiled kernels' barriers have never run on
# a GPU before) is stopped after 30 s, and the others still run.
#
#   scripts/gpu_check.sh OUTDIR
set -uo pipefail
out="${1:?usage: scripts/gpu_check.sh OUTDIR}"
mkdir -p "$out" && out="$(cd "$out" && pwd)"
cd "$(dirname "$0")/.."
start=$SECONDS
log() { echo "[gpu_check $((SECONDS - start))s] $*" | tee -a "$out/gpu_check.log"; }
deadline=$((start + ${BERTH_GPU_CHECK_BUDGET_S:-400}))
# cap SECONDS [RESERVE]: a phase's time limit, at most SECONDS, leaving RESERVE for what follows.
cap() {
  local left=$((deadline - SECONDS - ${2:-0}))
  [ "$left" -lt "$1" ] && echo $((left > 5 ? left : 5)) || echo "$1"
}
build="${BUILD_DIR:-build-gpu}"
debs="${BERTH_DEBS_DIR:-.gpu-debs}"
prefix=/tmp/berth-deps
jobs="$(nproc)"

# The toolkit where CUDA installs it, when nvcc is not on PATH (CMake looks only there and in
# $CUDA_PATH): a missing nvcc is a configure error that would end the run before anything ran.
if ! command -v nvcc >/dev/null; then
  for d in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda /usr/local/cuda-13*; do
    [ -n "$d" ] && [ -x "$d/bin/nvcc" ] && { export PATH="$d/bin:$PATH"; break; }
  done
fi
command -v nvcc >/dev/null && export CUDACXX="$(command -v nvcc)"
{ date -u '+%Y-%m-%d %H:%M:%S UTC'; nvidia-smi; nvcc --version; cmake --version; g++ --version
  command -v ninja && ninja --version
  timeout 60 python3 -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda,
                                             "GPU visible:", torch.cuda.is_available())'
  # where the driver and the libraries are, should the build or a test not find them
  env | grep -E '^(PATH|LD_LIBRARY_PATH|CUDA[A-Z_]*)=' ; ldconfig -p | grep -E 'libcuda\.|cublas|nccl'
} > "$out/nvidia-smi.txt" 2>&1
# PyTorch's figures, also when nothing of berth's builds (then they are all this run brings back).
# PyTorch loads its own libraries (RPATH $ORIGIN): it gets the box's LD_LIBRARY_PATH, where the
# driver may be, without the unpacked prefix added below.
base_ld="${LD_LIBRARY_PATH:-}"
torch_figures() {
  LD_LIBRARY_PATH="$base_ld" timeout "$1" python3 -u bench/gpu/torch_reference.py
}
# nothing of berth's built: PyTorch's figures, the configure log's end, status 2
give_up() {
  for f in "$build/CMakeFiles/CMakeConfigureLog.yaml" "$build/CMakeFiles/CMakeError.log"; do
    [ -f "$f" ] && { echo "== tail of $f"; tail -60 "$f"; } >> "$out/build.log"
  done
  log "measuring PyTorch's figures anyway"
  torch_figures "$(cap 120)" > "$out/bench.txt" 2>&1
  exit 2
}
log "$(date -u '+%Y-%m-%d %H:%M UTC'), sources $(git rev-parse --short HEAD 2>/dev/null || echo '(no git)')"
log "GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)"
for tool in nvcc cmake g++; do
  if ! command -v "$tool" >/dev/null; then
    log "no $tool on this machine (PATH=$PATH): nothing can be built"
    give_up
  fi
done
log "tools: $(nvcc --version | tail -1); $(cmake --version | head -1); $(g++ --version | head -1)"

cmake_args=(-DBERTH_GPU_CHECK=ON -DBERTH_CUDA=ON "-DBERTH_CUDA_ARCHS=${BERTH_CUDA_ARCHS:-90}"
            -DCMAKE_BUILD_TYPE=Release)
if compgen -G "$debs/*.deb" >/dev/null; then
  mkdir -p "$prefix"
  for f in "$debs"/*.deb; do
    dpkg -x "$f" "$prefix" 2>/dev/null && continue
    # no dpkg: a .deb is an ar archive whose data.tar.* holds the files
    member=$(ar t "$f" 2>/dev/null | grep '^data\.tar' | head -1)
    case "$member" in
      *.xz) unpack=(xz -dc) ;; *.zst) unpack=(zstd -dc) ;; *.gz) unpack=(gzip -dc) ;; *) unpack=(cat) ;;
    esac
    { [ -n "$member" ] && ar p "$f" "$member" | "${unpack[@]}" | tar -x -C "$prefix"; } ||
      log "could not unpack $f (no dpkg, and ar/tar failed)"
  done
  cmake_args+=("-DBERTH_DEPS_PREFIX=$prefix")
  export LD_LIBRARY_PATH="$prefix/usr/lib/x86_64-linux-gnu:$prefix/usr/lib/x86_64-linux-gnu/openblas-openmp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  log "unpacked $(ls "$debs"/*.deb | wc -l) packages from $debs into $prefix"
fi
command -v ninja >/dev/null && [ ! -f "$build/CMakeCache.txt" ] && cmake_args+=(-G Ninja)
# NCCL: the CUDA toolkit's when it has one, else PyTorch's nvidia-nccl wheel (header and
# libnccl.so.2), so the one-rank NCCL tests (gpu.single.Nccl.*) run on a box without MPI.
cuda_root="$(dirname "$(command -v nvcc)")/.."
if [ -z "${NCCL_ROOT:-}" ] && { [ ! -f "$cuda_root/include/nccl.h" ] ||
                                ! compgen -G "$cuda_root/lib*/libnccl.so*" >/dev/null; }; then
  NCCL_ROOT=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null || true)
fi
[ -n "${NCCL_ROOT:-}" ] && cmake_args+=("-DNCCL_ROOT=$NCCL_ROOT")

# A build made elsewhere (carried to the GPU box) is used only when it was built from these very
# sources: their hash is stored next to it. Anything else is (re)built.
src_hash=$(find CMakeLists.txt kernels runtime tests bench packing parallel launcher -type f \
             \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.cmake' \
                -o -name 'CMakeLists.txt' \) 2>/dev/null | LC_ALL=C sort | xargs sha1sum | sha1sum | cut -c1-16)
# A build directory configured at another path (carried from a checkout elsewhere) has that path
# in its CMakeCache.txt and test files: cmake refuses it and ctest cannot find the binaries.
if [ -f "$build/CMakeCache.txt" ] &&
   ! grep -qxF "CMAKE_HOME_DIRECTORY:INTERNAL=$PWD" "$build/CMakeCache.txt"; then
  log "$build was configured for another source directory: building afresh"
  rm -rf "$build"
fi
# A carried build linked against an NCCL this box lacks (the toolkit's, on the machine it was made
# on) would not even start its tests: it is rebuilt against this box's.
nccl_lib=$(grep -o 'NCCL_LIBRARY:FILEPATH=.*' "$build/CMakeCache.txt" 2>/dev/null | cut -d= -f2)
if [ -n "$nccl_lib" ] && [ "${nccl_lib%NOTFOUND}" = "$nccl_lib" ] && [ ! -e "$nccl_lib" ]; then
  log "$build links $nccl_lib, which this box lacks: building afresh"
  rm -rf "$build"
fi
if [ -x "$build/bench/gpu/bench_gpu_ops" ] && [ -x "$build/tests/test_backend_gpu" ] &&
   [ "$(cat "$build/.berth-src-hash" 2>/dev/null)" = "$src_hash" ]; then
  log "using the build in $build (built from these sources, $src_hash)"
else
  log "configuring and building into $build ($jobs jobs)"
  if ! cmake -S . -B "$build" "${cmake_args[@]}" > "$out/build.log" 2>&1; then
    log "configure failed; the end of build.log:"
    tail -40 "$out/build.log"
    give_up
  fi
  # Keep going past a target that fails (a test against this box's NCCL, say): the others still
  # build, and whatever built is run.
  keep_going=(-k); grep -q "CMAKE_GENERATOR:INTERNAL=Ninja" "$build/CMakeCache.txt" && keep_going=(-k 0)
  if timeout "$(cap 240 100)" cmake --build "$build" -j "$jobs" -- "${keep_going[@]}" \
       >> "$out/build.log" 2>&1; then
    echo "$src_hash" > "$build/.berth-src-hash"
    log "built"
  else
    log "the build did not finish (some targets failed or it ran out of time); the end of build.log:"
    grep -E "error|Error|FAILED" "$out/build.log" | tail -20
    if [ ! -x "$build/tests/test_backend_gpu" ] && [ ! -x "$build/bench/gpu/bench_gpu_ops" ]; then
      give_up
    fi
    log "going on with what built"
  fi
fi
nccl_lib=$(grep -o 'NCCL_LIBRARY:FILEPATH=.*' "$build/CMakeCache.txt" | cut -d= -f2)
nccl_found=1
if [ -z "$nccl_lib" ] || [ "${nccl_lib%NOTFOUND}" != "$nccl_lib" ]; then
  log "NCCL: not found (set NCCL_ROOT): the gpu.single.Nccl tests skip"
  nccl_found=0
else
  log "NCCL: $nccl_lib"
fi

# The GPU tests alone first: the host runs of the same binaries (label cpu; the tiled kernels
# emulated thread by thread take minutes) must not use up their time. Those run last, in parallel.
# Two passes: the tiled tensor-core attention's tests last, so that hangs there (stopped at 30 s
# each) cannot starve the others of the phase's time. BERTH_TOL_REPORT=1 makes every test print
# its measured errors ([tol] lines), kept from ctest's logs.
tiled='Bf16Attention|Bf16RingAttention|TiledBf16|Bf16WithTensorCore|Bf16Tracks'
test_logs="$build/gpu-test-logs.txt"
: > "$test_logs"
: > "$out/tests.txt"
tests_rc=0
for pass in other tiled; do
  if [ "$pass" = other ]; then select=(-E "$tiled"); limit=$(cap 110 140); else select=(-R "$tiled"); limit=$(cap 120 100); fi
  log "GPU tests ($pass)"
  BERTH_TOL_REPORT=1 timeout "$limit" ctest --test-dir "$build" -L gpu "${select[@]}" \
    --timeout 30 --no-tests=error --output-on-failure >> "$out/tests.txt" 2>&1
  rc=$?
  [ "$rc" -ne 0 ] && tests_rc=$rc
  cat "$build/Testing/Temporary/LastTest.log" >> "$test_logs" 2>/dev/null
done
grep -E "tests passed|tests failed|Skipped|\*\*\*Failed|Timeout|Not Run|No tests were found" \
  "$out/tests.txt" | tee -a "$out/gpu_check.log"
# The GPU test programs must have built: a missing one is a test ctest cannot find, not a pass.
for t in test_backend_gpu test_model_backend_gpu; do
  if [ ! -x "$build/tests/$t" ]; then
    log "$t did not build: its GPU tests did not run"
    [ "$tests_rc" -eq 0 ] && tests_rc=4
  fi
done
echo "$tests_rc" > "$out/gpu_tests_rc"
# A GPU test that skipped on a box with a GPU checked nothing (a CUDA backend that cannot start, a
# driver too old for the toolkit): ctest counts it as passed, the check fails (status 3) and names
# each with gtest's reason, from ctest's log. Skips that are not the GPU's are allowed: the NCCL
# tests when the build found no NCCL (said above), a test that lacks the license corpus.
gpus=$(timeout 20 nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
if [ "${gpus:-0}" -gt 0 ]; then
  # "NAME<TAB>REASON" for each skipped test: the line after gtest's "FILE:LINE: Skipped"
  reasons=$(awk '/^[0-9]+\/[0-9]+ Testing: /{name=$3} after{print name "\t" $0; after=0}
                 /: Skipped$/{after=1}' "$test_logs" 2>/dev/null)
  unexplained=0
  while read -r name; do
    [ -n "$name" ] || continue
    reason=$(printf '%s\n' "$reasons" | awk -F'\t' -v n="$name" '$1 == n {print $2; exit}')
    case "$name" in *.Nccl.*) [ "$nccl_found" = 0 ] && continue ;; esac
    case "$reason" in *"common-licenses corpus"*) continue ;; esac
    log "a GPU is visible, yet $name skipped: ${reason:-(no reason in the ctest log)}"
    unexplained=$((unexplained + 1))
  done <<< "$(grep -E '^[[:space:]]*[0-9]+ - .* \(Skipped\)$' "$out/tests.txt" |
              sed -E 's/^[[:space:]]*[0-9]+ - (.*) \(Skipped\)$/\1/')"
  if [ "$unexplained" -gt 0 ] && [ "$tests_rc" -eq 0 ]; then
    tests_rc=3
    echo "$tests_rc" > "$out/gpu_tests_rc"
  fi
fi
# The measured CUDA-vs-CPU error of every op, and bf16 against fp32 over 200 steps, from the
# tests' own output (ctest keeps it for passing tests too).
grep -E '^\[tol\]|bf16 vs fp32|^[0-9]+/[0-9]+ Test: ' "$test_logs" > "$out/tolerances.txt"

log "benchmark"
ulimit -c 0  # a crashed benchmark leaves no core file to fill the disk
bench() { timeout "$1" stdbuf -oL "$build/bench/gpu/bench_gpu_ops" "${@:2}" || echo "bench_gpu_ops ${*:2}: exit status $?"; }
{
  echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nvidia-smi --query-gpu=name --format=csv,noheader 2>&1 | head -1)"
  # Line-buffered, so that a program stopped at its limit keeps the lines it printed. Each part
  # in its own process, the comparison's figures first: berth's bf16 training step, PyTorch's,
  # berth's bf16 attention and GEMM, then the slower fp32 half with whatever time is left.
  bench "$(cap 40 150)" --precision bf16 --only step
  torch_figures "$(cap 90 70)"
  bench "$(cap 50 25)" --precision bf16 --only attention
  bench "$(cap 15 15)" --precision bf16 --only gemm
  bench "$(cap 90)" --precision fp32
} > "$out/bench.txt" 2>&1
python3 bench/gpu/compare.py "$out/bench.txt" > "$out/compare.txt" 2>&1
cat "$out/compare.txt" >> "$out/bench.txt" && rm -f "$out/compare.txt"
cat "$out/bench.txt" >> "$out/gpu_check.log"
grep -E "^(attention|training|compare)" "$out/bench.txt"  # the ratios, in the command's output

if [ "${BERTH_GPU_CHECK_HOST_TESTS:-0}" = 1 ] && [ $((deadline - SECONDS)) -ge 60 ]; then
  log "host tests (label cpu, $jobs at a time, $(cap 150) s at most)"
  timeout "$(cap 150)" ctest --test-dir "$build" -L cpu -j "$jobs" --output-on-failure \
    > "$out/tests_host.txt" 2>&1
  grep -E "tests passed|tests failed|\*\*\*Failed|Timeout" "$out/tests_host.txt" | tee -a "$out/gpu_check.log"
else
  log "host tests not run (BERTH_GPU_CHECK_HOST_TESTS=1 runs them, time permitting; CI runs them)"
fi
log "done (GPU tests exit status $tests_rc)"
exit $tests_rc
