#!/usr/bin/env bash
# The checks to run on a real GPU (docs/gpu-validation.md records each run):
# the GPU test suite on CUDA by group, the collectives with NCCL and without,
# training beside the PyTorch peer, the overlap demos, the benchmarks, NCCL
# bootstrapped over MPI, Nsight Compute. Each command has a time limit and
# the script goes on after a failure; the exit status says whether any failed.
#
# usage: scripts/gpu-check.sh [--bin DIR] [--data DIR] [--log FILE] [--record DIR] [--dry-run] [STEP...]
#   --bin DIR    the Release build (binaries under DIR/{tests,examples,bench}, or
#                all in DIR itself; default: build)
#   --data DIR   Fashion-MNIST (default $WEFT_FASHION_MNIST, else /usr/share/datasets/fashion-mnist)
#   --log FILE   also append everything to FILE
#   --record DIR where the never-run step writes the GPU record's rows
#                (gpu-record-rows.md, a markdown table fragment for
#                docs/gpu-validation.md; default $OUT, else /tmp/weft-gpu-check-record)
#   --dry-run    print the plan (each section, its budget and its commands) and run nothing;
#                exit 1 when the never-run step's budgets add up to more than 540 s
#   STEP         env tests collectives train peers demos bench mpi ncu (default: all),
#                or, not by default:
#               never-run   every GPU path the record lists as never run, in one call
#                           under 9 minutes on one H100/H200 with 16 cores, each section
#                           with its own time budget: the precision, optimizer and
#                           checkpoint tests on CUDA; ResNet-18 batch 256 channels-last
#                           at fp32, TF32, bf16 and fp16, Weft then PyTorch
#                           (bench/torch_train_peer.py) in the same call; bf16 replayed
#                           with stream graphs (--hybridize --gpu-graphs) beside PyTorch
#                           eager bf16; benchmark mode's first-step cost; a cost table
#                           from a trace and the step it predicts; weft-bench-ops' half
#                           elementwise and copy rows; causal attention on CUDA (gpu
#                           attention* and weft-bench-ops --attention); NCCL point to
#                           point with one GPU per process (check_nccl_p2p, where
#                           defined). Writes one
#                           record row per section (command, machine, date, commit, result)
#               gemm        weft-bench-ops: GEMM through the engine vs cuBLAS direct in
#                           float32, TF32 and bfloat16 (1024-8192^2)
#               attention   causal attention on CUDA: the gpu attention* cases (float64
#                           references, two runs' bits, the fused cuDNN path against the
#                           batched-GEMM path), then weft-bench-ops --attention (FLOP/s
#                           against cuBLAS's batched GEMM, the GEMM path against the
#                           fused path); about a minute
#               precision   ResNet-18, Weft beside PyTorch at fp32|tf32|bf16|fp16 (2
#                           epochs of 12,800 images each), bf16 with benchmarked
#                           convolutions, channels-last (both) and --hybridize
#                           --gpu-graphs (Weft), and benchmark mode's first-step cost
#               accuracy    ResNet-18 10 full epochs in bf16, fp16 and fp32 (Weft)
#               costtable   ResNet-18 (batch 256) traced on the GPU, its cost table
#                           (scripts/cost-table-from-trace), the step predicted on
#                           simulated GPUs from the table and from the dgx-h100 profile
#                           beside the measured one; about 2 minutes
#               state       optimizers, checkpoints and ZeRO's GPU tests on CUDA; ResNet-18
#                           with AdamW stopped after an epoch and resumed (the same weights
#                           as unbroken); the AdamW step as one op vs one per parameter
#                           (weft-bench-ops); about 4 minutes
#               memory      ZeRO's memory on CUDA: the offload cases (one-GPU members;
#                           two-GPU cases skip), then the wide MLP (8 x 4096^2, AdamW)
#                           with stages 1-3 offloaded beside unsharded: each stage's peak,
#                           its split by role and offload_overlap; ResNet-18 with and
#                           without --recompute 13; about 5 minutes
#               Mixed precision on one GPU in one 10-minute call: env tests gemm
#               precision (about 7 minutes on an H200); accuracy (about 4) in a second.
#               On the machine's CPUs with no GPU involved:
#               mpi-cpu     Weft over MPI against plain MPI, 2 and 4 ranks, 3 runs
#                           of 1-16 MiB and 2 of 64-256 MiB, split inside and
#                           outside MPI (scripts/bench-allreduce-mpi.sh
#                           --call-times; docs/performance.md, Collectives)
#               engine-cpu  weft-bench-engine --quick on 2 cores and on all, 3 runs
#                           each, summarized by scripts/engine-summary
# PyTorch (bench/torch_train_peer.py) runs without LD_LIBRARY_PATH, so that it
# loads its own cuDNN whatever Weft's binaries were pointed at.
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=build
data=${WEFT_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
log=""
record=${OUT:-/tmp/weft-gpu-check-record}
dry=0
steps=()
while (($#)); do
  case $1 in
    --bin) bin=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --log) log=$2; shift 2 ;;
    --record) record=$2; shift 2 ;;
    --dry-run) dry=1; shift ;;
    -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "${BASH_SOURCE[0]}"; exit 0 ;;
    -*) echo "gpu-check.sh: unknown option $1" >&2; exit 2 ;;
    *) steps+=("$1"); shift ;;
  esac
done
((${#steps[@]})) || steps=(env tests collectives train peers demos bench mpi ncu)
[[ -n "$log" ]] && exec > >(tee -a "$log") 2>&1
export WEFT_GPU_BACKEND=cuda WEFT_FASHION_MNIST=$data
failed=0
t0=$(date +%s)
find_bin() {
  local d
  for d in "$bin/tests" "$bin/examples" "$bin/bench" "$bin"; do
    [[ -x "$d/$1" ]] && { echo "$d/$1"; return; }
  done
  ((dry)) && { echo "$bin/$1"; return; }  # the plan names it all the same
  echo "gpu-check.sh: no $1 under $bin" >&2
  echo false
}
step() { printf '\n=== [%ss] %s\n' "$(($(date +%s) - t0))" "$*"; }
run() {  # run SECONDS COMMAND...
  local limit=$1 start rc
  shift
  if ((dry)); then
    printf '  [budget %3d s] %s\n' "$limit" "$*"
    planned=$((planned + limit))
    return 0
  fi
  echo "\$ $*"
  start=$(date +%s%N)
  timeout -k 5 "$limit" "$@"
  rc=$?
  local ms=$((($(date +%s%N) - start) / 1000000))
  printf -- '--- exit %d after %d.%03d s\n' "$rc" $((ms / 1000)) $((ms % 1000))
  ((rc == 0)) || failed=1
  last_rc=$rc last_s=$((ms / 1000))
}
planned=0 last_rc=0 last_s=0
# The never-run step's record: one markdown row per section.
machine() { nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || echo "no nvidia-smi"; }
record_row() {  # record_row SECTION RESULT COMMAND
  ((dry)) && return 0
  mkdir -p "$record"
  local rows=$record/gpu-record-rows.md
  [[ -s $rows ]] || printf '| GPU path | date | device | commit | result | command |\n|---|---|---|---|---|---|\n' > "$rows"
  # shellcheck disable=SC2016  # the backquotes are markdown's
  printf '| %s | %s | %s | %s | %s | `%s` |\n' "$1" "$(date -u +%Y-%m-%d)" "$(machine)" \
    "$(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown)" "$2" "$3" >> "$rows"
}
# A section of the never-run step: its commands under one budget (a hang
# costs that section alone), then its record row.
section() {  # section NAME SECONDS COMMAND...
  local name=$1 limit=$2
  shift 2
  if ((dry)); then
    printf '\n--- section: %s\n' "$name"
    run "$limit" "$@"
    return 0
  fi
  step "$name"
  run "$limit" "$@"
  local result
  if ((last_rc == 0)); then result="pass (${last_s} s)"
  elif ((last_rc == 124 || last_rc == 137)); then result="TIMED OUT after ${limit} s"
  else result="FAIL: exit ${last_rc} (${last_s} s)"; fi
  record_row "$name" "$result" "$*"
}
peer() { run "$1" env -u LD_LIBRARY_PATH python3 "$here/bench/torch_train_peer.py" --data "$data" "${@:2}"; }
tests=$(find_bin weft-tests-gpu)

# ---- check_nccl_p2p: NCCL's send/recv and its checks ahead (step nccl-p2p, not by default) ----
# The checks over MPI (CPU, 2 ranks), weft-bench-allreduce --nccl-check (the host
# path before a launch, meeting against ahead), then NCCL's collectives and
# send/recv across processes: one rank per GPU (NCCL refuses two ranks of one
# communicator on one GPU, so with one GPU the 2-rank case prints its skip line).
check_nccl_p2p() {
  local mpi_tests gpus np
  mpi_tests=$(find_bin weft-tests-parallel-mpi)
  gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
  np=$((gpus >= 2 ? 2 : 1))
  step "NCCL's checks over MPI on the CPU (2 ranks)"
  run 300 env WEFT_GPU_BACKEND=none WEFT_FLIGHT_RECORDER_DIR=/tmp mpirun --allow-run-as-root --oversubscribe --bind-to none \
    -np 2 "$mpi_tests" \
    -tc="NCCL's*,a send and recv*" --no-version --no-colors
  step "the host path before an NCCL launch: meeting against ahead (2 ranks, cpu(0))"
  run 300 env WEFT_GPU_BACKEND=none mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 \
    "$(find_bin weft-bench-allreduce)" --nccl-check --json --reps 11
  step "NCCL across $np process(es), one GPU each: collectives, then send/recv both ways"
  run 300 mpirun --allow-run-as-root --bind-to none -np "$np" "$mpi_tests" -tc='*GPU*' --no-version --no-colors
  if ((gpus < 2)); then
    step "NCCL send/recv at 2 ranks on $gpus GPU(s): expect its skip line (a GPU per rank)"
    run 120 mpirun --allow-run-as-root --bind-to none -np 2 "$mpi_tests" -tc='GPU send/recv across processes over NCCL*' \
      --no-version --no-colors
  fi
}
rest=()
for s in "${steps[@]}"; do
  if [[ $s == nccl-p2p ]]; then check_nccl_p2p; else rest+=("$s"); fi
done
steps=("${rest[@]}")
# ---- end of check_nccl_p2p ----

for s in "${steps[@]}"; do
  ((dry)) && [[ $s != never-run ]] && { echo "gpu-check.sh: --dry-run plans the never-run step only ($s skipped)"; continue; }
  case $s in
    never-run)
      # Budgets: 9 minutes in all (540 s), the --dry-run test checks the sum.
      resnet=$(find_bin weft-train-resnet)
      few=(--batch-size 256 --epochs 1 --limit 2560 --json)
      peer_py=(env -u LD_LIBRARY_PATH python3 "$here/bench/torch_train_peer.py" --data "$data" --model resnet18)
      section "precision, optimizers, checkpoints and the transformer ops and GPT on CUDA (gpu precision*, gpu optim*, gpu checkpoint*, gpu transformer*, gpu permute*, gpu gpt*)" 75 \
        "$tests" -tc='gpu precision*,gpu optim*,gpu checkpoint*,gpu transformer*,gpu permute*,gpu gpt*' --no-version --no-colors
      for p in fp32 tf32 bf16 fp16; do
        section "ResNet-18 batch 256 $p channels-last (Weft)" 18 "$resnet" --device gpu:0 --precision "$p" --channels-last "${few[@]}"
        section "ResNet-18 batch 256 $p channels-last (PyTorch peer)" 18 "${peer_py[@]}" --precision "$p" --channels-last "${few[@]:0:6}"
      done
      section "ResNet-18 batch 256 bf16 channels-last replayed with stream graphs (--hybridize --gpu-graphs)" 25 \
        "$resnet" --device gpu:0 --precision bf16 --channels-last --hybridize --gpu-graphs "${few[@]}"
      section "cuDNN heuristic algorithms, 2 steps (bf16): the baseline of benchmark mode's first-step cost" 15 \
        "$resnet" --device gpu:0 --precision bf16 --batch-size 256 --epochs 1 --limit 512 --json
      section "cuDNN benchmark mode's first-step cost (bf16, 2 steps: the difference from the heuristic run)" 25 \
        env WEFT_PROFILE_SUMMARY=1 "$resnet" --device gpu:0 --precision bf16 --conv-algo benchmark --batch-size 256 \
        --epochs 1 --limit 512 --json
      section "cost table from a trace of ResNet-18 on the GPU, and the step it predicts on simulated GPUs" 45 \
        bash -c "set -e; '$resnet' --device gpu:0 --batch-size 256 --limit 2560 --epochs 1 --trace /tmp/weft-never-run-trace.json --json;
                 python3 '$here/scripts/cost-table-from-trace' /tmp/weft-never-run-trace.json -o /tmp/weft-never-run-costs.txt;
                 env WEFT_GPU_BACKEND=sim '$resnet' --sim-model /tmp/weft-never-run-costs.txt --batch-size 256 --limit 1536 --steps 5 --json"
      section "weft-bench-ops: half elementwise rows beside the copy bandwidth" 45 \
        bash -c "'$(find_bin weft-bench-ops)' --json --quick | tee /tmp/weft-never-run-ops.jsonl | grep -Ei 'bf16|fp16|half|copy' || { echo 'no half or copy rows in weft-bench-ops output'; exit 1; }"
      section "causal attention on CUDA: float64 references and two runs' bits (gpu attention*, the fused cuDNN and batched-GEMM paths), FLOP/s rows with both paths (weft-bench-ops --attention)" 60 \
        bash -c "set -e; '$tests' -tc='gpu attention*' --no-version --no-colors;
                 '$(find_bin weft-bench-ops)' --attention --json --reps 3 | tee /tmp/weft-never-run-attention.jsonl | grep '\"device\":\"gpu' || { echo 'no GPU attention rows in weft-bench-ops output'; exit 1; }"
      section "GPT-2 small bf16 training step, Weft against PyTorch eager in the same call (bench/gpt_vs_torch.py)" 55 \
        bash -c "set -e; cat '$here'/docs/*.md '$here'/docs/design/*.md > /tmp/weft-never-run-text.txt;
                 python3 '$here/bench/gpt_vs_torch.py' --weft '$(find_bin weft-train-gpt)' --gpt small --device cuda \
                   --precision bf16 --batch-size 8 --steps 12 --rounds 1 --text /tmp/weft-never-run-text.txt"
      # NCCL point to point with one GPU per process: check_nccl_p2p is
      # defined in this file where that check is built.
      if declare -F check_nccl_p2p > /dev/null; then
        section "NCCL point to point, one GPU per process" 45 check_nccl_p2p
      elif ((dry)); then
        printf '\n--- section: NCCL point to point, one GPU per process\n  not built (check_nccl_p2p is not defined)\n'
      else
        step "NCCL point to point, one GPU per process: not built (check_nccl_p2p is not defined)"
        record_row "NCCL point to point, one GPU per process" "not built" "check_nccl_p2p"
      fi
      if ((dry)); then
        printf '\nplan: never-run, budget total %d s (limit 540)\n' "$planned"
        ((planned <= 540)) || { echo "gpu-check.sh: the never-run step's budgets exceed 540 s" >&2; exit 1; }
      else
        echo "record rows: $record/gpu-record-rows.md"
      fi
      ;;
    env)
      step "machine"
      date -u; nproc
      nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
      ldd "$tests" | grep -E 'not found|cudart|cublas|cudnn|nccl'
      env -u LD_LIBRARY_PATH python3 -c "import torch; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version())" 2>&1 | tail -1
      ;;
    tests)
      step "the GPU test suite on CUDA, by group (a hang costs one group)"
      for g in 'gpu backend*' 'gpu ops*' 'gpu copies*' 'gpu tensor op*' 'gpu engines*' 'gpu errors*' \
               'gpu streams*' 'gpu stream graphs*' 'gpu kvstore*' 'gpu data parallel*' 'gpu pipeline*' 'gpu resnet*' \
               'gpu memory format*' '*bfloat16*,*float16*,*precision*,*tf32*,*loss scal*,*conv algo*'; do
        run 120 "$tests" -tc="$g" --duration=true --no-version --no-colors
      done
      ;;
    collectives)
      step "collectives: NCCL in process, then the ring over device copies"
      run 120 "$tests" -tc='gpu collectives*' --duration=true --no-version --no-colors
      WEFT_NCCL=0 run 120 "$tests" -tc='gpu collectives*' --no-version --no-colors
      ;;
    train)
      step "LeNet: batch 8 plain, hybridized, hybridized with stream graphs and in bulks of 16 (training must be identical), then 10 epochs at 256; ResNet-18, 3 epochs"
      run 120 "$(find_bin weft-train-lenet)" --device gpu:0 --batch-size 8 --epochs 1 --limit 8192 --json
      run 120 "$(find_bin weft-train-lenet)" --device gpu:0 --batch-size 8 --epochs 1 --limit 8192 --json --hybridize
      run 120 "$(find_bin weft-train-lenet)" --device gpu:0 --batch-size 8 --epochs 1 --limit 8192 --json --hybridize --gpu-graphs
      run 120 "$(find_bin weft-train-lenet)" --device gpu:0 --batch-size 8 --epochs 1 --limit 8192 --json --bulk 16
      run 120 "$(find_bin weft-train-lenet)" --device gpu:0 --json
      run 300 "$(find_bin weft-train-resnet)" --device gpu:0 --epochs 3 --json
      ;;
    peers)
      step "PyTorch on the same GPU: LeNet (batch 8 and 256), ResNet-18 with TF32 (its default) and in float32"
      peer 120 --model lenet --batch-size 8 --epochs 2 --limit 8192
      peer 120 --model lenet --epochs 10
      peer 300 --model resnet18 --epochs 3
      peer 300 --model resnet18 --epochs 3 --fp32
      ;;
    demos)
      step "overlap demos (4: CPU + GPU, 5: GPU compute + copies), the trace summary, the tour"
      run 120 "$(find_bin weft-demo-cpu-gpu)" --json
      run 120 "$(find_bin weft-demo-compute-copy)" --json --trace /tmp/weft-gpu-check-compute-copy.json
      run 60 python3 "$here/scripts/trace-summary" /tmp/weft-gpu-check-compute-copy.json
      run 120 "$(find_bin weft-demo)" --json --out /tmp/weft-gpu-check-demo
      ;;
    bench)
      step "per-op cost and GEMM through the engine vs direct; allreduce with NCCL beside ncclAllReduce"
      run 300 "$(find_bin weft-bench-ops)" --json --quick
      run 300 "$(find_bin weft-bench-allreduce)" --members 1 --json
      step "half kernels' bandwidth against a device-to-device copy (bw_*: ratio >= 0.8 each)"
      run 120 "$(find_bin weft-bench-ops)" --json --bandwidth --reps 7 > /tmp/weft-gpu-check-bandwidth.jsonl
      cat /tmp/weft-gpu-check-bandwidth.jsonl
      run 30 python3 -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
rows = [r for r in rows if r["case"].startswith("bw_")]
low = [r for r in rows if r["ratio"] < 0.8]
for r in rows:
    print("%-22s %8.1f GB/s  copy %8.1f GB/s  ratio %.3f%s" % (r["case"], r["kernel_gbps"], r["copy_gbps"],
          r["ratio"], "  BELOW 0.8" if r["ratio"] < 0.8 else ""))
sys.exit(1 if low or not rows else 0)' /tmp/weft-gpu-check-bandwidth.jsonl
      ;;
    attention)
      step "causal attention on CUDA against float64 references, two runs' bits, the fused cuDNN path against the batched-GEMM path (gpu attention*)"
      run 120 "$tests" -tc='gpu attention*' --no-version --no-colors
      step "causal attention's FLOP/s against cuBLAS's batched GEMM of the scores' shape, and the GEMM path against the fused path (attention_* rows)"
      run 300 "$(find_bin weft-bench-ops)" --attention --json
      ;;
    gemm)
      step "GEMM through the engine vs cuBLAS direct: float32, TF32, bfloat16 (matmul_*, matmul_tf32_*, matmul_bf16_*)"
      run 300 "$(find_bin weft-bench-ops)" --json --quick
      ;;
    precision)
      step "ResNet-18 per precision, Weft beside PyTorch (2 epochs of 12,800 images; compare sec_per_epoch)"
      resnet=$(find_bin weft-train-resnet)
      few=(--epochs 2 --limit 12800 --json)
      for p in fp32 tf32 bf16 fp16; do
        run 120 "$resnet" --device gpu:0 --precision "$p" "${few[@]}"
        peer 120 --model resnet18 --precision "$p" "${few[@]:0:4}"
      done
      step "bf16 at its fastest: benchmarked convolutions; channels-last (both); hybridized with stream graphs (Weft)"
      run 120 "$resnet" --device gpu:0 --precision bf16 --conv-algo benchmark "${few[@]}"
      run 120 "$resnet" --device gpu:0 --precision bf16 --conv-algo benchmark --channels-last "${few[@]}"
      peer 120 --model resnet18 --precision bf16 --conv-algo benchmark --channels-last "${few[@]:0:4}"
      run 120 "$resnet" --device gpu:0 --precision bf16 --conv-algo benchmark --hybridize --gpu-graphs "${few[@]}"
      step "benchmark mode's first-step cost: 2 steps each way (the difference of the two times), the chosen algorithms"
      run 120 "$resnet" --device gpu:0 --precision bf16 --epochs 1 --limit 512 --json
      WEFT_PROFILE_SUMMARY=1 run 120 "$resnet" --device gpu:0 --precision bf16 --conv-algo benchmark --epochs 1 \
        --limit 512 --json
      ;;
    accuracy)
      step "ResNet-18, 10 epochs: bf16 and fp16 (loss scaling) reach >= 0.90, within 0.01 of fp32"
      for p in bf16 fp16 fp32; do
        run 200 "$(find_bin weft-train-resnet)" --device gpu:0 --precision "$p" --epochs 10 --json
      done
      ;;
    state)
      step "training state on CUDA: optimizers (bitwise the CPU's), checkpoints of GPU tensors, ZeRO (2-GPU cases skip on one)"
      run 300 "$tests" -tc='gpu optim*,gpu checkpoint*,gpu zero*' --no-version --no-colors
      step "ResNet-18 with AdamW: one epoch, a checkpoint, a new process resumes; the weights equal an unbroken run's"
      run 300 python3 "$here/tests/scripts/check_resume.py" --exact "$(find_bin weft-train-resnet)" --devices gpu:0 \
        --limit 2048 --batch-size 128 --optimizer adamw
      step "the AdamW step over LeNet's and ResNet-18's parameters: one foreach op vs one op per parameter"
      run 120 "$(find_bin weft-bench-ops)" --json
      ;;
    memory)
      step "ZeRO-Offload on CUDA: offloaded stages give the unoffloaded weights (one-GPU members; two-GPU cases skip)"
      run 300 "$tests" -tc='gpu zero memory*' --no-version --no-colors
      step "the wide MLP, AdamW, one GPU: each stage offloaded beside unsharded; peaks, their split and the update's overlap"
      run 300 "$(find_bin weft-bench-data-parallel)" --model wide-mlp --width 4096 --batch 1024 --devices gpu:0 \
        --shard none,optimizer,gradients,parameters --offload --optimizer adamw --json --steps 5 --reps 3
      step "ResNet-18, batch 256: the activation peak and step time with 13 recomputed segments"
      for recompute in "" "--recompute 13"; do
        # shellcheck disable=SC2086  # the flag and its value, or nothing
        run 120 "$(find_bin weft-train-resnet)" --device gpu:0 --batch-size 256 --limit 5120 --epochs 1 $recompute --json
      done
      ;;
    costtable)
      step "ResNet-18's step measured on the GPU beside simulated GPUs' prediction: from a cost table of its trace, and from the dgx-h100 profile alone"
      resnet=$(find_bin weft-train-resnet)
      run 180 "$resnet" --device gpu:0 --batch-size 256 --limit 5120 --epochs 1 --trace /tmp/weft-resnet-trace.json --json
      run 60 python3 "$here/scripts/cost-table-from-trace" /tmp/weft-resnet-trace.json -o /tmp/weft-resnet-costs.txt
      for model in /tmp/weft-resnet-costs.txt dgx-h100; do
        run 120 env WEFT_GPU_BACKEND=sim "$resnet" --sim-model "$model" --batch-size 256 --limit 1536 \
          --steps 5 --json
      done
      ;;
    mpi)
      step "NCCL bootstrapped over MPI (one rank: NCCL refuses two ranks on one GPU)"
      run 120 mpirun --allow-run-as-root -np 1 "$(find_bin weft-tests-parallel-mpi)" -tc='*GPU*' --no-version --no-colors
      ;;
    mpi-cpu)
      step "Weft over MPI beside MPI_Allreduce on this machine's cores (no GPU involved)"
      # With the MPI profiling interposer where it was built beside the bench:
      # each implementation's time per call inside MPI_Allreduce and outside.
      bench=$(find_bin weft-bench-allreduce)
      split=()
      [[ -f $(dirname "$bench")/libweft-mpi-call-times.so ]] && split=(--call-times)
      run 600 env WEFT_GPU_BACKEND=none bash "$here/scripts/bench-allreduce-mpi.sh" --bin "$bench" "${split[@]}" \
        --out /tmp/weft-gpu-check-allreduce-mpi.jsonl -- --members 1 --min-bytes 1048576 --max-bytes 16777216 \
        --reps 11 --per-rep
      # 64 and 256 MiB, two runs (a call takes 30-200 ms there); 10 reps, one
      # whole balanced order of the five implementations.
      run 300 env WEFT_GPU_BACKEND=none bash "$here/scripts/bench-allreduce-mpi.sh" --bin "$bench" "${split[@]}" \
        --runs 2 --out /tmp/weft-gpu-check-allreduce-mpi-large.jsonl -- --members 1 --min-bytes 67108864 \
        --max-bytes 268435456 --reps 10 --per-rep
      ;;
    engine-cpu)
      step "engine per-op cost beside oneTBB and OpenMP on 2 cores and on all (no GPU involved)"
      all=$(nproc)
      out=/tmp/weft-gpu-check-engine-cpu.jsonl
      : > "$out"
      for run_index in 1 2 3; do
        for cores in 2 "$all"; do
          echo "\$ WEFT_CPU_WORKERS=$cores taskset -c 0-$((cores - 1)) weft-bench-engine --quick --json (run $run_index)"
          env WEFT_GPU_BACKEND=none WEFT_CPU_WORKERS="$cores" timeout -k 5 300 taskset -c "0-$((cores - 1))" \
            "$(find_bin weft-bench-engine)" --quick --json --body empty --body 1us \
            --engines weft,bulk,replay,tbb_flow_graph,omp_depend |
            sed "s/^{/{\"tag\":\"$cores cores\",\"run\":$run_index,/" >> "$out"
          ((PIPESTATUS[0] == 0)) || failed=1
        done
      done
      run 60 python3 "$here/scripts/engine-summary" "$out"
      ;;
    ncu)
      step "Nsight Compute through scripts/profile-ncu.sh"
      run 180 bash "$here/scripts/profile-ncu.sh" --kernel gemm --launch-count 1 --output /tmp/weft-gpu-check-ncu \
        "$(find_bin weft-demo-cpu-gpu)" --count 2 --reps 1
      ;;
    *) echo "gpu-check.sh: unknown step $s" >&2; failed=1 ;;
  esac
done
((dry)) && exit 0
step "done ($( ((failed)) && echo 'something failed' || echo 'all passed'))"
exit $failed
