#!/usr/bin/env bash
# One device call: install the wheels carried in .whl/ (liger-kernel; cut-cross-entropy for bench_flce's cce rows),
# then the chosen parts; one log + JSON/PNG under $OUT (at most 8 files come back: run.log, gpu_tests.json,
# bench_flce.json, bench_e2e.json, bench_e2e.png, bench_ops.json, compile.json; step: bench_step[_TAG].json,
# bench_step[_TAG]_tps.png, bench_step[_TAG]_loss.png).
# Usage: bash benchmarks/gpu_run.sh PART...   (default: tests flce e2e)
#   tests          GPU tests (tests/kernels/test_gpu.py, test_gpu_variants.py, tests/alignment/test_gpu_alignment.py,
#                  tests/integrations/test_checkpointing.py on CUDA)
#   fidelity       custom ops on CUDA: opcheck of every op x layout, compiled variants, MoE router logits (installed
#                  transformers), compile-check rules
#   parity         bf16 GPU parity suite (tests/convergence -k gpu, without the with-logits runs), strategy as planned
#   parity-logits  bf16 with-logits parity of every family with a head (FLCE off, cross_entropy on), 24 steps
#   parity-tokens  the same with every apply() forcing the token-chunked FLCE; parity-vocab: vocab-chunked
#   flce / flce-quick   benchmarks/bench_flce.py (full sweep < 6 min / ~1 min subset)
#   e2e / e2e-quick     benchmarks/bench_e2e.py (64 processes < 9 min / 2 layers, 1 repeat)
#   e2e-compile    bench_e2e.py: hf, hf_compile, ours, ours_compile, liger on the llama and qwen3 2-layer cuts
#   step           benchmarks/bench_step.py (issue 25: real configs at realistic depth); the whole table does not fit
#                  one call: choose rows/methods with STEP_ARGS (e.g. "--models llama3_2_1b,qwen3_1_7b --shapes 2x4096
#                  --methods hf,liger,ours --tag dense4k"), join the calls' JSONs with bench_step.py --merge
#   ops            benchmarks/bench_ops.py
#   moe            MoE experts: bf16 GPU tests (tests/kernels/test_moe.py), benchmarks/probe_moe_kernels.py (ours vs
#                  grouped_mm, numerics vs fp32) and benchmarks/bench_moe.py (MOE_ARGS)
#   verify         what the CPU box changed since the last GPU run (NOTES, last plan): the new GPU tests (deepseek_v4's
#                  rope and shared expert, the kernel options of issue 24) and the bf16 parity of the families whose
#                  kernels were turned on without a GPU (VERIFY_FAMILIES, a pytest -k expression), and of the
#                  MoE families with moe_experts switched off (the rest of the patch without it)
#   compile        benchmarks/compile_families.py (every family's tiny model, inductor vs eager; one run, 8 worker processes)
#   probe-chunk    benchmarks/probe_token_chunk.py (one token chunk's GEMMs and row kernel, GPT-OSS and Llama)
#   probe-rows     benchmarks/probe_row_stats.py (the row kernels' statistics pass: lanes or blocks, block caps)
#   positions      benchmarks/probe_positions.py (a patched model called without positions: compiled SDPA unmasked)
#   probe-step     benchmarks/probe_e2e_step.py (one e2e step by phase and kernel kind, ours and liger)
#   profile-step   the same on a bench_step row (STEP_MODEL, default llama3_2_1b; STEP_SHAPE, default 2x4096; STEP_METHOD,
#                  default ours, then STEP_PEER, default liger: e.g. hf for a MoE row, hf_compile after ours_compile): issue 25's profile; PROBE_ARGS=--memory:
#                  also the tensors alive at the step's peak, by allocating line
# TF_WHEELS=DIR (carried, e.g. .whl_tf525 from `pip download transformers==X`): that transformers instead of the image's.
# Extra arguments for the benchmarks: FLCE_ARGS="..." E2E_ARGS="..." COMPILE_ARGS="..." STEP_ARGS="..."; per-part time limits: T_<PART> seconds,
# each cut to what is left of LIMIT_S (default 590: the device tool's 600 s per command) so the logs come back.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-benchmarks/results}
mkdir -p "$OUT"
LOG=$OUT/run.log
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "gpu_run: installing .whl/*.whl failed"; exit 1; }
else
  echo "gpu_run: no .whl/ (carry [\".whl\"]): the peer liger-kernel will be missing" | tee -a "$LOG"
fi
if [[ -n "${TF_WHEELS:-}" ]]; then  # another transformers (and what it needs) over the image's, e.g. the newest
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site_tf \
    "$TF_WHEELS"/*.whl || { echo "gpu_run: installing $TF_WHEELS/*.whl failed"; exit 1; }
  export PYTHONPATH=/tmp/site_tf${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used,temperature.gpu --format=csv,noheader | tee -a "$LOG"
summary=""
left() { echo $(( ${LIMIT_S:-590} - SECONDS )); }
part() {  # part NAME LIMIT_S TAIL_LINES COMMAND...
  local name=$1 limit=$2 lines=$3 start=$SECONDS rc
  shift 3
  if (( limit > $(left) - 5 )); then limit=$(( $(left) - 5 )); fi
  if (( limit < 20 )); then
    echo "=== $name: skipped, $(left) s left" | tee -a "$LOG"; summary="$summary $name=skipped"; return
  fi
  echo "=== $name: $*" | tee -a "$LOG"
  timeout "$limit" "$@" 2>&1 | tee -a "$LOG" | tail -n "$lines"
  rc=$?
  echo "=== $name: rc $rc in $((SECONDS - start)) s" | tee -a "$LOG"
  summary="$summary $name=rc$rc/$((SECONDS - start))s"
}
for p in ${*:-tests flce e2e}; do
  case $p in
    tests) GPU_TEST_REPORT=$OUT/gpu_tests.json part tests "${T_TESTS:-240}" 30 \
             python3 -m pytest -q -s -p no:cacheprovider tests/kernels/test_gpu.py tests/kernels/test_gpu_variants.py tests/alignment/test_gpu_alignment.py \
             tests/integrations/test_checkpointing.py ;;
    fidelity) part fidelity "${T_FIDELITY:-180}" 12 python3 -m pytest -q -p no:cacheprovider \
                tests/kernels/test_opcheck.py tests/kernels/test_compile_variants.py \
                tests/convergence/test_moe_router_logits.py tests/integrations/test_compile_families.py -k "not test_inductor_compile_with_triton" ;;
    parity) part parity "${T_PARITY:-300}" 60 \
              python3 -m pytest -q -p no:cacheprovider tests/convergence -k "gpu and not with_logits" ;;
    parity-logits) part parity-logits "${T_PARITY:-300}" 90 \
                     python3 -m pytest -q -p no:cacheprovider tests/convergence -k gpu_bf16_with_logits ;;
    parity-tokens|parity-vocab)
      FORCE_FLCE_STRATEGY=${p#parity-} PYTHONPATH=$PYTHONPATH:$PWD/benchmarks part "$p" "${T_PARITY:-300}" 60 \
        python3 -m pytest -q -p no:cacheprovider -p force_flce_strategy tests/convergence -k "gpu and not with_logits" ;;
    flce) part flce "${T_FLCE:-420}" 100 python3 benchmarks/bench_flce.py $FLCE_ARGS ;;
    flce-quick) part flce-quick "${T_FLCE:-150}" 60 python3 benchmarks/bench_flce.py --quick $FLCE_ARGS ;;
    e2e) part e2e "${T_E2E:-590}" 40 python3 benchmarks/bench_e2e.py --budget-s $(( $(left) - 60 )) $E2E_ARGS ;;
    e2e-quick) part e2e-quick "${T_E2E:-300}" 30 \
                 python3 benchmarks/bench_e2e.py --quick --budget-s $(( $(left) - 60 )) $E2E_ARGS ;;
    e2e-compile) part e2e-compile "${T_E2E:-400}" 30 python3 benchmarks/bench_e2e.py --budget-s $(( $(left) - 60 )) \
                   --layers 2 --tokens 4096 --repeats 1 --methods hf,hf_compile,ours,ours_compile,liger $E2E_ARGS ;;
    step) t=$(( ${T_STEP:-590} < $(left) - 5 ? ${T_STEP:-590} : $(left) - 5 ))
          part step "$t" 70 python3 benchmarks/bench_step.py --budget-s $(( t - 25 )) $STEP_ARGS ;;
    ops) part ops "${T_OPS:-150}" 24 python3 benchmarks/bench_ops.py ;;
    verify) GPU_TEST_REPORT=$OUT/gpu_tests.json part verify-tests "${T_VERIFY:-120}" 20 python3 -m pytest -q -s \
              -p no:cacheprovider tests/kernels/test_gpu.py \
              -k "deepseek_v4 or rope_tables or without_weight or multipliers or falcon_h1 or gemma3n"
            part verify-parity "${T_PARITY:-240}" 40 python3 -m pytest -q -p no:cacheprovider tests/convergence \
              -k "gpu and not with_logits and (${VERIFY_FAMILIES:-deepseek_v4 or \
olmo or gemma4 or gemma3n or deepseek_v2 or deepseek_v3 or glm4_moe_lite or granitemoehybrid or cohere or moe_experts_switched_off})" ;;
    moe) # the GPU-only tests: the CPU ones are CI's, and on the device they would use up the part's time
         part moe-tests "${T_MOE:-120}" 12 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_moe.py -k gpu_bf16
         part moe-probe "${T_MOE_PROBE:-150}" 40 python3 benchmarks/probe_moe_kernels.py --tokens 4096,16384
         part moe-bench "${T_MOE_BENCH:-300}" 60 python3 benchmarks/bench_moe.py $MOE_ARGS ;;
    compile) t=$(( ${T_COMPILE:-300} < $(left) ? ${T_COMPILE:-300} : $(left) ))
             part compile "$t" 85 python3 benchmarks/compile_families.py --workers 8 --budget-s $(( t - 50 )) $COMPILE_ARGS ;;
    probe-chunk) part probe-chunk "${T_PROBE:-120}" 12 bash -c \
                   "python3 benchmarks/probe_token_chunk.py --shape gpt_oss && python3 benchmarks/probe_token_chunk.py --shape llama --chunks 2048" ;;
    probe-rows) part probe-rows "${T_PROBE:-120}" 12 python3 benchmarks/probe_row_stats.py ;;
    profile-step) part profile-step "${T_PROBE:-240}" 80 bash -c "python3 benchmarks/probe_e2e_step.py --method ${STEP_METHOD:-ours} \
                    --step-model ${STEP_MODEL:-llama3_2_1b} --shape ${STEP_SHAPE:-2x4096} $PROBE_ARGS && python3 \
                    benchmarks/probe_e2e_step.py --method ${STEP_PEER:-liger} --step-model ${STEP_MODEL:-llama3_2_1b} \
                    --shape ${STEP_SHAPE:-2x4096} $PROBE_ARGS" ;;
    positions) part positions "${T_POSITIONS:-90}" 10 python3 benchmarks/probe_positions.py ;;
    probe-step) part probe-step "${T_PROBE:-180}" 80 bash -c \
                  "python3 benchmarks/probe_e2e_step.py --method ours && python3 benchmarks/probe_e2e_step.py --method liger" ;;
    *) echo "gpu_run: unknown part $p" | tee -a "$LOG" ;;
  esac
done
echo "gpu_run:$summary" | tee -a "$LOG"
